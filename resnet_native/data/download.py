"""Fetch the official CIFAR-10 archive, with a progress bar, into the cache folder by default.

The archive is downloaded to a temporary file beside its destination, its length checked against the server's
Content-Length, its MD5 (the one published on the CIFAR page) and SHA-256 checked, and only then renamed into place,
so an interrupted or corrupted download never looks like a good one and leaves no partial file. load_cifar10() reads
the .tar.gz directly; extract=True also unpacks it (members are checked to stay inside root) into a temporary folder
beside the destination, renamed into place once complete: the batches folder exists only whole, so an interrupted
extraction is redone by the next call instead of looking finished.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import sys
import tarfile
import tempfile
import urllib.request

from tqdm import tqdm

from .cifar10 import cache_folder

# name -> (url, md5 published on the CIFAR page, sha256, folder inside the archive)
ARCHIVES = {
    "python": ("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
               "c58f30108f718f92721af3b95e74349a",
               "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
               "cifar-10-batches-py"),
    "binary": ("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
               "c32a1d4ab5d03f1284b67883e8d87530",
               "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd",
               "cifar-10-batches-bin"),
}


def file_digests(path) -> tuple[str, str]:
    """(md5, sha256) hex digests of a file."""
    md5, sha = hashlib.md5(), hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            md5.update(block)
            sha.update(block)
    return md5.hexdigest(), sha.hexdigest()


def verify_archive(path, kind: str = "python") -> None:
    """ValueError unless the file's MD5 and SHA-256 are the official archive's."""
    _, md5, sha, _ = ARCHIVES[kind]
    got_md5, got_sha = file_digests(path)
    if got_md5 != md5 or got_sha != sha:
        raise ValueError(f"{path}: checksum mismatch for the CIFAR-10 {kind} archive "
                         f"(md5 {got_md5}, expected {md5}; sha256 {got_sha}, expected {sha})")


def _extract_options() -> dict:
    """Python's own "data" filter where this Python has it (3.12, 3.11.4, ...; it refuses the same and more);
    nothing where it does not."""
    return {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


def _safe_mode(member: tarfile.TarInfo) -> int:
    """The permission bits a member is extracted with: never setuid, setgid or sticky, never writable by group or
    others; files readable and writable by their owner, folders also searchable (what the data filter does)."""
    mode = member.mode & 0o755
    return mode | (0o700 if member.isdir() else 0o600)


def safe_extract(archive, root) -> None:
    """Extract a tar archive under root, refusing members that would land outside it or are links/devices.

    Modes are masked here (setuid, setgid and sticky bits dropped, no group/other write) and owners never taken
    from the archive, whether or not this Python's tarfile has the data filter."""
    root = pathlib.Path(root).resolve()
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for m in members:
            target = (root / m.name).resolve()
            if root != target and root not in target.parents:
                raise ValueError(f"{archive}: member {m.name!r} would be extracted outside {root}")
            if not (m.isfile() or m.isdir()):
                raise ValueError(f"{archive}: member {m.name!r} is not a regular file or folder")
            m.mode = _safe_mode(m)
            # Never chown to the archive's owner (extracting as root would): the extracting user owns the files.
            m.uid, m.gid, m.uname, m.gname = os.getuid(), os.getgid(), "", ""
        tar.extractall(root, members=members, **_extract_options())


def download(root=None, kind: str = "python", *, extract: bool = True, timeout: float = 60.0,
             progress: bool = True) -> pathlib.Path:
    """Download the official CIFAR-10 archive ('python' or 'binary' version) into root (default: the cache folder,
    ~/.cache/resnet_native/cifar10 or $RESNET_NATIVE_CACHE/cifar10, where the trainer also looks for it).

    Returns the extracted batches folder (extract=True) or the verified archive. An archive already present and
    verified is not downloaded again. progress: a progress bar on stderr.
    """
    if kind not in ARCHIVES:
        raise ValueError(f"kind: expected one of {sorted(ARCHIVES)}, got {kind!r}")
    url, _, _, folder = ARCHIVES[kind]
    root = cache_folder(root)
    root.mkdir(parents=True, exist_ok=True)
    archive = root / url.rsplit("/", 1)[1]
    try:
        verify_archive(archive, kind)
    except (OSError, ValueError):
        _fetch(url, archive, kind, timeout, progress)
    if not extract:
        return archive
    target = root / folder
    if not target.is_dir():
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{folder}.", suffix=".part", dir=root))
        try:
            safe_extract(archive, tmp)
            if not (tmp / folder).is_dir():
                raise ValueError(f"{archive}: no {folder}/ folder inside")
            try:
                os.replace(tmp / folder, target)
            except OSError:
                if not target.is_dir():  # else another process published it first: same archive, same files
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _fetch(url: str, archive: pathlib.Path, kind: str, timeout: float, progress: bool) -> None:
    """url -> archive, through a temporary file that is removed unless the whole, verified archive replaces it."""
    fd, tmp = tempfile.mkstemp(prefix=f".{archive.name}.", suffix=".part", dir=archive.parent)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            length = resp.headers.get("Content-Length")
            expected = int(length) if length and length.isdigit() else None
            with tqdm(total=expected, desc=f"downloading {archive.name}", unit="B", unit_scale=True,
                      unit_divisor=1024, disable=not progress, file=sys.stderr, leave=False) as bar:
                received = 0
                for block in iter(lambda: resp.read(1 << 20), b""):
                    out.write(block)
                    received += len(block)
                    bar.update(len(block))
            if expected is not None and received != expected:
                raise OSError(f"{url}: download interrupted after {received} of {expected} bytes")
            out.flush()
            os.fsync(out.fileno())
        verify_archive(tmp, kind)
        os.chmod(tmp, 0o644)
        os.replace(tmp, archive)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
