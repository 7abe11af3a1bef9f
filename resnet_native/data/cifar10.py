"""CIFAR-10 readers: the official python batches, the binary version, image folders, and tar archives of any of them.

Every source decodes to the same thing: uint8 images (N, 32, 32, 3) in HWC order and int32 labels in CIFAR-10's
class order, train and test. The first read of a source is cached as an uncompressed .npz (next to the source when
that folder is writable, else in the user cache dir), keyed by the source's sizes and mtimes, so later runs load the
arrays in well under a second instead of decoding 60,000 images again.
"""

from __future__ import annotations

import glob
import hashlib
import os
import pathlib
import re
import tarfile
import warnings
from dataclasses import dataclass, field

import numpy as np

from .._core.files import atomic_write_bytes
from ..formats.checkpoint import NpzReader
from . import tar_stream
from .cifar10_batches import CLASSES, parse_binary_batch, parse_python_batch
from .image_decode import IMAGE_SHAPE, DecodeQueue, image_extensions

# Bump when the decoded arrays would change for the same source (invalidates every cache file).
_CACHE_FORMAT = 1
_TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
_TEST_BATCH = "test_batch"
_SPLITS = ("train", "test")


@dataclass(frozen=True)
class CIFAR10Data:
    """Decoded CIFAR-10: uint8 (N, 32, 32, 3) images and int32 (N,) labels per split."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str = ""
    classes: tuple = field(default=CLASSES)

    def __repr__(self):
        return (f"CIFAR10Data(train={len(self.train_labels)}, test={len(self.test_labels)}, "
                f"source={self.source!r})")


# ----------------------------------------------------------------------------------------------------------------
# Source discovery


# The names a CIFAR-10 copy goes by in the folders default_data_path() searches, in the order it prefers them.
SOURCE_NAMES = ("cifar10-jpeg.tar.xz", "cifar10-jpeg", "cifar-10-batches-py", "cifar-10-batches-bin",
                "cifar-10-python.tar.gz", "cifar-10-binary.tar.gz")


def user_cache_dir() -> pathlib.Path:
    """$RESNET_NATIVE_CACHE/cifar10, else $XDG_CACHE_HOME (default ~/.cache)/resnet_native/cifar10."""
    base = os.environ.get("RESNET_NATIVE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "resnet_native")
    return pathlib.Path(base) / "cifar10"


def cache_folder(cache_dir=None) -> pathlib.Path:
    """Where decoded caches go when the source's own folder is not used, and where download() puts CIFAR-10:
    cache_dir when given, else user_cache_dir()."""
    return pathlib.Path(cache_dir) if cache_dir is not None else user_cache_dir()


def search_folders(cache_dir=None) -> list[pathlib.Path]:
    """The folders default_data_path() looks in: .data/ under the current directory, then the cache folder."""
    return [pathlib.Path(".data"), cache_folder(cache_dir)]


def default_data_path(cache_dir=None) -> pathlib.Path | None:
    """$RESNET_NATIVE_CIFAR10, else the first SOURCE_NAMES entry that exists in search_folders(cache_dir), else
    None."""
    env = os.environ.get("RESNET_NATIVE_CIFAR10")
    if env:
        return pathlib.Path(env)
    for folder in search_folders(cache_dir):
        for name in SOURCE_NAMES:
            if (folder / name).exists():
                return folder / name
    return None


def detect_format(path) -> tuple[str, pathlib.Path]:
    """('python' | 'binary' | 'folder' | 'tar', root) for a CIFAR-10 source; ValueError when it is none of them.

    A folder may hold the data directly or in one sub-folder (e.g. root/cifar-10-batches-py/).
    """
    path = pathlib.Path(path)
    if not path.exists():
        raise FileNotFoundError(f"CIFAR-10 source not found: {path}")
    if path.is_file():
        if tarfile.is_tarfile(path):
            return "tar", path
        raise ValueError(f"CIFAR-10 source {path}: a file must be a tar archive (.tar, .tar.gz, .tar.xz)")
    for root in [path, *sorted(p for p in path.iterdir() if p.is_dir())]:
        if (root / _TRAIN_BATCHES[0]).is_file() and (root / _TEST_BATCH).is_file():
            return "python", root
        if (root / f"{_TRAIN_BATCHES[0]}.bin").is_file() and (root / f"{_TEST_BATCH}.bin").is_file():
            return "binary", root
        if (root / "train").is_dir() and (root / "test").is_dir():
            return "folder", root
    raise ValueError(
        f"CIFAR-10 source {path}: expected python batches (data_batch_1..5, test_batch), binary batches "
        f"(data_batch_1..5.bin, test_batch.bin) or image folders (train/<class>/*, test/<class>/*)"
    )


def _concat(parts):
    if not parts:
        return np.zeros((0, *IMAGE_SHAPE), np.uint8), np.zeros((0,), np.int32)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def _read_batches(root: pathlib.Path, parse, suffix: str):
    split_arrays = []
    for names in (_TRAIN_BATCHES, (_TEST_BATCH,)):
        parts = []
        for name in names:
            p = root / f"{name}{suffix}"
            if not p.is_file():
                raise FileNotFoundError(f"CIFAR-10 batch missing: {p}")
            parts.append(parse(p.read_bytes(), str(p)))
        split_arrays.append(_concat(parts))
    return split_arrays


# ----------------------------------------------------------------------------------------------------------------
# Image decoding


def _class_index(name: str, where: str) -> int:
    try:
        return CLASSES.index(name.lower())
    except ValueError:
        raise ValueError(f"{where}: folder {name!r} is not a CIFAR-10 class (expected one of {CLASSES})") from None


def _sorted_splits(listing, images: np.ndarray):
    """listing: {split: [(class_index, file_name, index in images), ...]} -> [(images, labels) for train, test].

    Sorted by (class, file name): the same order whether the files come from a folder or a tar archive.
    """
    out = []
    for split in _SPLITS:
        entries = sorted(listing.get(split, []), key=lambda e: (e[0], e[1]))
        order = np.array([e[2] for e in entries], dtype=np.int64)
        out.append((images[order], np.array([e[0] for e in entries], dtype=np.int32)))
    return out


def _read_folder(root: pathlib.Path, workers):
    exts = image_extensions()
    listing = {}
    with DecodeQueue(workers) as queue:
        for split in _SPLITS:
            split_dir = root / split
            entries = []
            for class_dir in sorted(p for p in split_dir.iterdir() if p.is_dir() and not p.name.startswith(".")):
                label = _class_index(class_dir.name, str(split_dir))
                for f in class_dir.iterdir():
                    if f.is_file() and not f.name.startswith(".") and f.suffix.lower() in exts:
                        entries.append((label, f.name, queue.add(str(f), f"{split}/{CLASSES[label]}/{f.name}")))
            listing[split] = entries
        return _sorted_splits(listing, queue.result())


_BATCH_NAME = re.compile(r"^(data_batch_[1-5]|test_batch)(\.bin)?$")


def _suffix(base: str) -> str:
    """PurePosixPath(base).suffix, lower-cased."""
    dot = base.rfind(".")
    return base[dot:].lower() if 0 < dot < len(base) - 1 else ""


def _tar_regular_files(path: pathlib.Path):
    """(name, bytes) of every regular file, by tarfile: the reader of the archives tar_stream does not model."""
    with tarfile.open(path, mode="r|*") as tar:
        for member in tar:
            if member.isfile():
                yield member.name, tar.extractfile(member).read()


def _read_tar(path: pathlib.Path, workers):
    """Streams the archive once (no extraction to disk): batches are parsed as they pass, images go to the decoding
    workers as they pass."""
    try:
        return _read_tar_files(path, tar_stream.regular_files(path), workers)
    except tar_stream.Unsupported:
        return _read_tar_files(path, _tar_regular_files(path), workers)


def _read_tar_files(path: pathlib.Path, files, workers):
    """[(images, labels) for train, test] of an archive's (name, bytes) files."""
    exts = image_extensions()
    batches = {}  # name -> parsed (images, labels)
    listing = {split: [] for split in _SPLITS}
    with DecodeQueue(workers) as queue:
        for name, raw in files:
            parts = [p for p in name.split("/") if p and p != "."]  # what PurePosixPath.parts gives, faster
            base = parts[-1] if parts else "."
            if base.startswith("."):
                continue
            m = _BATCH_NAME.match(base)
            if m:
                parse = parse_binary_batch if m.group(2) else parse_python_batch
                batches[base] = parse(raw, f"{path}:{name}")
            elif len(parts) >= 3 and parts[-3] in _SPLITS and _suffix(base) in exts:
                label = _class_index(parts[-2], f"{path}:{'/'.join(parts[:-1])}")
                listing[parts[-3]].append((label, base, queue.add(raw, name)))
        images = queue.result()
    if batches:
        suffix = ".bin" if any(k.endswith(".bin") for k in batches) else ""
        split_arrays = []
        for names in (_TRAIN_BATCHES, (_TEST_BATCH,)):
            missing = [n + suffix for n in names if n + suffix not in batches]
            if missing:
                raise ValueError(f"{path}: archive lacks CIFAR-10 batches {missing}")
            split_arrays.append(_concat([batches[n + suffix] for n in names]))
        return split_arrays
    if not listing["train"] and not listing["test"]:
        raise ValueError(f"{path}: archive holds neither CIFAR-10 batches nor train/<class>/* image folders")
    return _sorted_splits(listing, images)


def decode_source(path, workers: int | None = None) -> CIFAR10Data:
    """Decode a CIFAR-10 source without any cache."""
    kind, root = detect_format(path)
    if kind == "python":
        (tr, trl), (te, tel) = _read_batches(root, parse_python_batch, "")
    elif kind == "binary":
        (tr, trl), (te, tel) = _read_batches(root, parse_binary_batch, ".bin")
    elif kind == "folder":
        (tr, trl), (te, tel) = _read_folder(root, workers)
    else:
        (tr, trl), (te, tel) = _read_tar(root, workers)
    return CIFAR10Data(tr, trl, te, tel, source=str(path))


# ----------------------------------------------------------------------------------------------------------------
# Cache


def source_fingerprint(path) -> str:
    """A key that changes when the source changes: absolute path plus every file's relative path, size and mtime."""
    path = pathlib.Path(path).resolve()
    h = hashlib.sha256(f"cifar10-cache-v{_CACHE_FORMAT}|{path}".encode())
    if path.is_file():
        st = path.stat()
        h.update(f"|{st.st_size}|{st.st_mtime_ns}".encode())
    else:
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            for name in sorted(filenames):
                p = os.path.join(dirpath, name)
                st = os.stat(p)
                h.update(f"|{os.path.relpath(p, path)}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:20]


_CACHE_KEY = re.compile(r"[0-9a-f]{20}\.npz")  # what follows '<source name>.cifar10cache-' in a cache's name


def _cache_name(path: pathlib.Path, key: str) -> str:
    return f"{path.name}.cifar10cache-{key}.npz"


def _cache_dirs(path: pathlib.Path, cache_dir) -> list[pathlib.Path]:
    if cache_dir is not None:
        return [pathlib.Path(cache_dir)]
    return [path.resolve().parent, user_cache_dir()]


def atomic_write_npz(target, arrays: dict) -> None:
    """np.savez to a temporary file in the target's folder, fsync, then os.replace: readers never see half a file."""
    atomic_write_bytes(target, lambda f: np.savez(f, **arrays))


# CIFAR10Data's arrays in the order of its fields: what a cache file holds, and what the decoding child sends.
ARRAY_FIELDS = ("train_images", "train_labels", "test_images", "test_labels")


def _load_cache(p: pathlib.Path, source: str) -> CIFAR10Data | None:
    """The arrays of a cache file, or None when it is unreadable, cut short, garbage or foreign: the caller then
    decodes the source again and overwrites the file. Every member's header is checked against its stored size
    (checkpoint.NpzReader) before anything is read."""
    try:
        with NpzReader(p) as z:
            if any(name not in z for name in ARRAY_FIELDS):
                return None
            arrays = {name: z.read(name) for name in ARRAY_FIELDS}
    except (OSError, ValueError):
        return None
    images = (arrays["train_images"], arrays["test_images"])
    labels = (arrays["train_labels"], arrays["test_labels"])
    ok = all(a.dtype == np.uint8 and a.ndim == 4 and a.shape[1:] == IMAGE_SHAPE for a in images)
    ok = ok and all(a.dtype == np.int32 and a.ndim == 1 for a in labels)
    ok = ok and all(len(i) == len(label) for i, label in zip(images, labels, strict=True))
    if not ok:
        return None
    for name in ("train_labels", "test_labels"):
        a = arrays[name]
        if a.size and (a.min() < 0 or a.max() >= len(CLASSES)):
            # A cache whose labels no decoder writes: refused like a damaged one (decoded again, rewritten).
            warnings.warn(f"CIFAR-10 decode cache {p}: {name} outside [0, {len(CLASSES)}) (min {a.min()}, max "
                          f"{a.max()}); refused, decoding the source again", RuntimeWarning, stacklevel=3)
            return None
    return CIFAR10Data(*(arrays[name] for name in ARRAY_FIELDS), source=source)


def cache_path_for(path, cache_dir=None) -> pathlib.Path | None:
    """The existing cache file of a source, or None."""
    path = pathlib.Path(path)
    name = _cache_name(path, source_fingerprint(path))
    for d in _cache_dirs(path, cache_dir):
        if (d / name).is_file():
            return d / name
    return None


def load_cached(path, cache_dir=None) -> CIFAR10Data | None:
    """A source's decoded arrays from its cache file, or None when there is none (or it is unreadable)."""
    existing = cache_path_for(path, cache_dir)
    return None if existing is None else _load_cache(existing, str(path))


def load_cifar10(path=None, *, cache: bool = True, cache_dir=None, workers: int | None = None) -> CIFAR10Data:
    """Load CIFAR-10 from any supported source (see detect_format), through the .npz cache.

    path: a folder of python or binary batches, an image-folder root (train/<class>/*, test/<class>/*), or a tar
    archive of any of these (read by streaming; nothing is extracted). None: default_data_path().
    cache: read/write the decoded arrays as <source name>.cifar10cache-<key>.npz next to the source (or in
    cache_dir; falls back to the user cache dir when the source's folder is read-only).
    workers: decoding processes for image sources (default: CPU count, at most 16).
    """
    if path is None:
        path = default_data_path()
        if path is None:
            raise FileNotFoundError(f"CIFAR-10: no path given and none found in {search_folders()} (set "
                                    "RESNET_NATIVE_CIFAR10 or use resnet_native.data.download())")
    path = pathlib.Path(path)
    if not cache:
        return decode_source(path, workers)
    data = load_cached(path, cache_dir)
    if data is not None:
        return data
    data = decode_source(path, workers)
    write_cache(path, data, cache_dir)
    return data


def write_cache(path, data: CIFAR10Data, cache_dir=None) -> pathlib.Path | None:
    """Write a source's decoded arrays to its cache file (see load_cifar10) and remove its older ones; the file
    written, or None when no cache folder could be written."""
    path = pathlib.Path(path)
    name = _cache_name(path, source_fingerprint(path))
    arrays = {key: getattr(data, key) for key in ARRAY_FIELDS}
    for d in _cache_dirs(path, cache_dir):
        try:
            atomic_write_npz(d / name, arrays)
        except OSError:
            continue  # read-only folder: try the next place
        _remove_stale_caches(d, path, name)
        return d / name
    return None


def _remove_stale_caches(folder: pathlib.Path, path: pathlib.Path, keep: str) -> None:
    """Delete this source's older cache files (another key) in folder. The source's name is escaped for the glob
    and the match checked again: a source named '[ab]' must not match source 'a''s caches."""
    prefix = f"{path.name}.cifar10cache-"
    for old in folder.glob(glob.escape(prefix) + "*.npz"):
        if old.name != keep and old.name.startswith(prefix) and _CACHE_KEY.fullmatch(old.name[len(prefix):]):
            try:
                old.unlink()
            except OSError:
                pass
