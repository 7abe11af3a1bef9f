"""Atomic file writes: a temporary file beside the target, fsynced, then renamed over it.

A crash leaves either the old file or the new one, never half of one. Every writer in the package goes through
here (checkpoints, the algorithm cache, releases, calibration and metrics files).
"""

from __future__ import annotations

import os
import pathlib
import tempfile


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


def current_umask() -> int:
    """The process's umask. Linux reports it in /proc/self/status; elsewhere reading it means setting it and
    setting it straight back, which another thread creating a file in between would see."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path, write) -> None:
    """write(f) into a temporary file beside path, fsync, then rename over path. The file gets the mode open()
    would give a new file (0o666 less the umask): mkstemp makes its temporary 0o600."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fchmod(f.fileno(), 0o666 & ~current_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path, text: str) -> None:
    atomic_write_bytes(path, lambda f: f.write(text.encode()))
