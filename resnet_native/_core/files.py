"""Atomic file writes: a temporary file beside the target, fsynced, then renamed over it.

A crash leaves either the old file or the new one, never half of one. Every writer in the package goes through
here (checkpoints, the algorithm cache, releases, calibration and metrics files).

The temporary is `.<name>.<pid>.<random>.tmp`, named by its writer's process id. A writer killed mid-write
(SIGKILL, power loss) cannot remove its own, so the next write to the same target removes every temporary of that
target whose writer process no longer exists (os.kill(pid, 0) says so; a live writer's temporary is never touched).
The pid is only meaningful on this host: a folder shared between hosts may see another host's live writer as dead,
so there writers of one target should not run on several hosts at once (or a reused pid keeps a leftover, harmless).
"""

from __future__ import annotations

import os
import pathlib
import re
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
    remove_dead_temporaries(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
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


def _process_alive(pid: int) -> bool:
    if pid <= 0:
        return True  # not a process id this module writes: leave it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        return True
    except OSError:
        return True
    return True


def remove_dead_temporaries(path) -> list:
    """Remove the temporaries of target `path` (`.<name>.<pid>.<random>.tmp`) left by writers that no longer run;
    returns the paths removed. Never one whose pid is alive (this process's included)."""
    path = pathlib.Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(\d+)\.[A-Za-z0-9_]+\.tmp")
    removed = []
    try:
        entries = os.scandir(path.parent)
    except OSError:
        return removed
    with entries:
        for entry in entries:
            m = pattern.fullmatch(entry.name)
            if m is None or _process_alive(int(m.group(1))):
                continue
            try:
                os.unlink(entry.path)
            except FileNotFoundError:  # another writer removed it first
                continue
            except OSError:
                continue
            removed.append(pathlib.Path(entry.path))
    return removed


def atomic_write_text(path, text: str) -> None:
    atomic_write_bytes(path, lambda f: f.write(text.encode()))
