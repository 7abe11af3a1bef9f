"""The algorithm cache and its file: every convolution's chosen algorithm (engine, algorithm, knobs, workspace,
fused or not), kept per device by the native core and saved as JSON headed by the GPU and the cuDNN version.

The native core parses and checks every key and choice (algo_cache_insert refuses what save_algorithm_cache
cannot have written); this module reads and writes the file. Other modules keep sections of their own in the same
file (inference/choice_cache.py): a save keeps them.
"""

from __future__ import annotations

import json
import os
import warnings

from .._core.files import atomic_write_text
from .._core.loader import _C
from .._core.names import bounded_int
from .._core.runtime import require_gpu

_CACHE_FORMAT = "resnet_native.algorithm_cache"
_CACHE_VERSION = 1
_MAX_CAPACITY = 2**63 - 1  # the native core takes an int64


def algorithm_cache_entries() -> list:
    """Every cached choice, as last_algorithm's dicts (each with its key), the least recently used first."""
    return [dict(entry, key=key) for key, entry in _C.algo_cache_entries()]


def clear_algorithm_cache() -> None:
    """Forget every cached choice (the next call of each problem searches again). Counters are kept."""
    _C.algo_cache_clear()


def algorithm_cache_stats() -> dict:
    """hits and misses of cache lookups, finds (timed searches run), the number of entries, the capacity and
    evictions (entries dropped to stay within it)."""
    return dict(_C.algo_cache_stats())


def _capacity(value, name: str) -> int:
    return bounded_int(name, value, 1, _MAX_CAPACITY, "entries")


def set_algorithm_cache_capacity(capacity) -> None:
    """Keep at most `capacity` choices (4096 by default). Past it, a new choice evicts the least recently used one:
    every op's lookup makes its problem the most recently used (last_algorithm and algorithm_cache_entries do
    not). A smaller capacity evicts at once. An evicted problem is searched again on its next call, which algo='find'
    refuses during CUDA-graph capture."""
    _C.algo_cache_set_capacity(_capacity(capacity, "capacity"))


def algorithm_cache_capacity() -> int:
    """The most choices the algorithm cache keeps (set_algorithm_cache_capacity)."""
    return _C.algo_cache_capacity()


def set_plan_cache_capacity(capacity) -> None:
    """Keep at most `capacity` graph-engine execution plans (1024 by default), evicting the least recently run past
    it, and at once when the capacity shrinks; an evicted plan is rebuilt from its cached choice on its next call
    (no search). Plans run during a CUDA-graph capture are pinned (a captured graph may launch their kernels):
    never evicted, so they may exceed the capacity; only _drop_cached_descriptors / release_handles drop them."""
    _C.graph_set_plan_cache_capacity(_capacity(capacity, "capacity"))


def plan_cache_capacity() -> int:
    """The most graph-engine execution plans kept besides pinned ones (set_plan_cache_capacity)."""
    return _C.graph_plan_cache_stats()["capacity"]


def plan_cache_stats() -> dict:
    """The graph engine's execution plans: plans (held now), capacity, evictions (plans dropped to stay within it)
    and pinned (run during a CUDA-graph capture: never evicted)."""
    return dict(_C.graph_plan_cache_stats())


def _device_identity() -> tuple:
    """(GPU name, cuDNN version loaded, current device index): the header of a cache file."""
    require_gpu()
    import cupy

    device = cupy.cuda.runtime.getDevice()
    name = cupy.cuda.runtime.getDeviceProperties(device)["name"]
    if isinstance(name, bytes):
        name = name.decode()
    return name, _C.cudnn_version(), device


# What a save writes anew; any other top-level field is another module's section, kept by a save.
_OWN_FIELDS = ("format", "version", "gpu", "cudnn_version", "entries")


def _read_cache_file(path) -> dict:
    """The JSON object of a cache file, its format and version checked (ValueError naming the file)."""
    with open(os.fspath(path), "rb") as f:
        raw = f.read()
    try:
        payload = json.loads(raw.decode("utf-8"))
        # A \ud800 escape is JSON, but no UTF-8 string: the native core could not take it (a RuntimeError).
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeDecodeError as e:  # a binary file
        raise ValueError(f"algorithm cache file {path}: not UTF-8 text, so not JSON ({e})") from None
    except UnicodeEncodeError as e:
        raise ValueError(f"algorithm cache file {path}: a string with an unpaired surrogate escape ({e})") from None
    except ValueError as e:  # json.JSONDecodeError, or an int of more digits than Python converts
        raise ValueError(f"algorithm cache file {path}: not JSON ({e})") from None
    except RecursionError:  # nesting deeper than the parser's recursion limit
        raise ValueError(f"algorithm cache file {path}: not an algorithm cache (JSON nested too deeply)") from None
    if not isinstance(payload, dict) or payload.get("format") != _CACHE_FORMAT:
        raise ValueError(f"algorithm cache file {path}: not a resnet_native algorithm cache")
    version = payload.get("version")
    if isinstance(version, bool) or version != _CACHE_VERSION:  # true == 1 in Python
        raise ValueError(f"algorithm cache file {path}: format version {version!r} is not supported")
    return payload


def _written_here(payload: dict) -> bool:
    """Whether a cache file's header names this GPU model and cuDNN version: its timings hold here."""
    gpu, cudnn, _ = _device_identity()
    return payload.get("gpu") == gpu and payload.get("cudnn_version") == cudnn


def _kept_sections(path) -> dict:
    """The other modules' sections (inference/choice_cache.py) of the cache of this GPU and cuDNN at `path`, as
    read; none from a missing, unreadable or foreign file, which a save replaces whole, as it always did."""
    try:
        payload = _read_cache_file(path)
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in payload.items() if k not in _OWN_FIELDS} if _written_here(payload) else {}


def save_algorithm_cache(path) -> int:
    """Write every cached choice to `path` (JSON, replaced atomically), headed by the GPU name and the cuDNN
    version, the least recently used first; returns the number of entries written. When `path` already holds a
    cache of this GPU and cuDNN, its other sections (an InferenceEngine's quantize_from='auto' choices) are
    kept."""
    gpu, cudnn, _ = _device_identity()
    entries = []
    for e in algorithm_cache_entries():
        entries.append({k: e[k] for k in ("key", "engine", "mode", "algo", "algo_name", "math_type", "knobs",
                                          "workspace", "time_ms", "fused_path")})
    payload = {"format": _CACHE_FORMAT, "version": _CACHE_VERSION, "gpu": gpu, "cudnn_version": cudnn,
               "entries": entries, **_kept_sections(path)}
    atomic_write_text(path, json.dumps(payload, indent=1))
    return len(entries)


def load_algorithm_cache(path) -> int:
    """Add the choices saved in `path` to the cache (replacing entries of the same problems) and return how many.

    A file written on another GPU model or cuDNN version is ignored with a warning (returns 0): its timings say
    nothing about this machine. Entries are re-keyed to the current device. A malformed file raises ValueError
    and adds nothing. Other sections are not read here (inference/choice_cache.py reads the engines' choices).

    Entries are inserted in the file's order (save_algorithm_cache writes the least recently used first), so they
    become the most recently used and their order is restored; the count returned is what the file holds, but
    the cache keeps at most algorithm_cache_capacity() entries: of a larger file, the last ones (the most recently
    used when it was saved), and entries cached before the load are evicted first.
    """
    payload = _read_cache_file(path)
    entries = payload.get("entries")
    if not isinstance(entries, list):
        raise ValueError(f"algorithm cache file {path}: 'entries' is not a list")
    gpu, cudnn, device = _device_identity()
    if not _written_here(payload):
        warnings.warn(
            f"algorithm cache {path} ignored: it was written on {payload.get('gpu')!r} with cuDNN "
            f"{payload.get('cudnn_version')!r}, this is {gpu!r} with cuDNN {cudnn}",
            UserWarning,
            stacklevel=2,
        )
        return 0
    try:  # the native core checks every key and choice first, and inserts nothing when one is wrong
        _C.algo_cache_insert_entries(entries, device)
    except ValueError as e:
        raise ValueError(f"algorithm cache file {path}: {e}") from None
    return len(entries)


def key_fields(key: str) -> dict:
    """The fields of a cache key as the native core parses them: {'direction': 'forward', 'x': (8, 64, 32, 32),
    'ws': None, ...}; ValueError naming the field for a malformed key."""
    return _C.parse_conv_key(key)


def insert_choice(key: str, choice: dict) -> None:
    """Put a choice in the cache for `key` on the current device, replacing what it held (the inference engine's
    tuning records the unfused path this way when it timed faster)."""
    _C.algo_cache_insert(key, choice)


def read_sections(path) -> dict | None:
    """The other modules' sections of the cache file at `path` ({name: value}, unchecked: each owner checks its
    own), or None when the file is missing or was written on another GPU model or cuDNN version. ValueError
    naming the file for one that is no algorithm cache."""
    if not os.path.exists(path):
        return None
    payload = _read_cache_file(path)
    if not _written_here(payload):
        return None
    return {k: v for k, v in payload.items() if k not in _OWN_FIELDS}


def store_section(path, name: str, value) -> bool:
    """Replace one section of the cache file at `path`, keeping everything else it holds; atomic. False, writing
    nothing, when the file is missing or another machine's (replaced since this process saved it)."""
    if name in _OWN_FIELDS:
        raise ValueError(f"section name {name!r}: the algorithm cache's own field")
    if not os.path.exists(path):
        return False
    payload = _read_cache_file(path)
    if not _written_here(payload):
        return False
    payload[name] = value
    atomic_write_text(path, json.dumps(payload, indent=1))
    return True
