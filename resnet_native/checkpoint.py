"""Training checkpoints: nested state (dicts/lists of arrays and plain values) in one .npz file, written atomically.

The layout needs no pickle: every array is its own .npz member, and the nesting plus all non-array values are kept
as JSON in the member "__tree__", with {"__array__": "name"} where an array was. Loading therefore cannot run
code, and the file opens with plain NumPy.

Atomic: the file is written to a temporary name in the same folder, flushed and fsynced, then os.replace()d over
the target (and the folder is fsynced), so a crash leaves either the old checkpoint or the new one, never half.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile

import numpy as np

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


def _unflatten(node, arrays):
    if isinstance(node, dict):
        if "__array__" in node:
            return arrays[node["__array__"]]
        if "__tuple__" in node:
            return tuple(_unflatten(v, arrays) for v in node["__tuple__"])
        if "__items__" in node:
            return {_unflatten(k, arrays): _unflatten(v, arrays) for k, v in node["__items__"]}
        return {k: _unflatten(v, arrays) for k, v in node.items()}
    if isinstance(node, list):
        return [_unflatten(v, arrays) for v in node]
    return node


def fsync_dir(folder) -> None:
    """Make a rename in folder durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path, write) -> None:
    """write(f) into a temporary file beside path, fsync, then rename over path."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path, text: str) -> None:
    atomic_write_bytes(path, lambda f: f.write(text.encode()))


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


def load_checkpoint(path) -> dict:
    """The state dict save_checkpoint wrote (arrays come back as NumPy arrays, tuples as tuples)."""
    with np.load(path, allow_pickle=False) as z:
        if _TREE not in z.files:
            raise ValueError(f"{path}: not a resnet_native checkpoint (no {_TREE} member)")
        meta = json.loads(z[_TREE].tobytes().decode())
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: unsupported checkpoint format {meta.get('format')!r} (expected {FORMAT})")
        arrays = {k: z[k] for k in z.files if k != _TREE}
    return _unflatten(meta["tree"], arrays)
