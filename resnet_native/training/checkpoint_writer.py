"""Checkpoints written in the background while the GPU keeps training, and the convolution algorithm cache saved
beside them (another algorithm gives other rounding, so the cache is part of what makes --resume exact).

Crash safety: every file is published by a rename (checkpoint.atomic_write_bytes, or a hard link renamed into
place), so a process killed at any moment leaves each file either old or new. What such a kill can leave behind
is a temporary file (.<name>.<random>.tmp, .<name>.link): a writer given its run folder removes the temporaries
of that folder's files when it starts (remove_stale_temporaries; a run folder has one writer, the Trainer's, so
none of them can be a live write). Publishing order: with a new best epoch, best.npz is written first and
last.npz then linked to it, so that at every point the best epoch last.npz names is no newer than best.npz (a
crash in between leaves a last.npz one epoch behind, which --resume recomputes exactly).
"""

from __future__ import annotations

import glob
import os
import pathlib
import queue
import sys
import threading
import warnings

from ..formats.checkpoint import save_checkpoint
from ..ops import conv


class CheckpointWriter:
    """Serialises and fsyncs checkpoints on a background thread.

    submit() takes host copies (state_dicts are NumPy), or a function the writer's thread calls to get them, and
    returns at once; a later submit waits for the one before, and flush() for all of them. After a failed write,
    the jobs still queued are dropped, and the next submit or flush raises that error. With best_path, the
    state is written there first and then published at path with a hard link, when possible, so an improving
    epoch costs one write, not two, and best is never behind what last says.
    As a context manager it closes on exit; when the block raised, that error is the one reported and a pending write
    error is only printed.

    folder, files: the run folder this writer owns and the names of the files written there (by it and by its
    owner); the stale temporaries of those files are removed before anything is written.
    """

    def __init__(self, folder=None, files=()):
        if folder is not None:
            remove_stale_temporaries(folder, files)
        self._q = queue.Queue(maxsize=1)
        self._error = None
        self._thread = threading.Thread(target=self._run, name="checkpoint-writer", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            job = self._q.get()
            if job is None:
                self._q.task_done()
                return
            try:
                if self._error is not None:  # a write failed: the run stops at the next submit or flush with it
                    continue
                path, state, best_path = job
                if callable(state):
                    state = state()
                if best_path is None:
                    save_checkpoint(path, state)
                else:  # best first: a crash before the link leaves last behind best, never ahead of it
                    save_checkpoint(best_path, state)
                    _publish_copy(best_path, path, state)
            except BaseException as e:  # reported on the next submit/flush
                self._error = e
            finally:
                self._q.task_done()

    def _raise(self):
        if self._error is not None:
            e, self._error = self._error, None
            raise RuntimeError(f"writing a checkpoint failed: {e}") from e

    def submit(self, path, state, best_path=None):
        self._raise()
        self._q.put((pathlib.Path(path), state, best_path))

    def busy(self) -> bool:
        """Whether a write is in progress or queued: a checkpoint submitted now would be written after it."""
        with self._q.mutex:  # the queue's own count of jobs put and not yet marked done, which flush() joins on
            return self._q.unfinished_tasks > 0

    def flush(self):
        self._q.join()
        self._raise()

    def close(self):
        try:
            self.flush()
        finally:  # stop the thread even when a stored error is raised
            self._q.put(None)
            self._thread.join()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
            return False
        try:
            self.close()
        except Exception as e:
            print(f"warning: {e} (while handling the error below)", file=sys.stderr)
        return False


def _link_name(dst: pathlib.Path) -> pathlib.Path:
    return dst.with_name(f".{dst.name}.link")


def remove_stale_temporaries(folder, names) -> list[pathlib.Path]:
    """Delete what an interrupted write of each file in `names` left in `folder`: atomic_write_bytes's
    .<name>.<random>.tmp and _publish_copy's .<name>.link. Only for a folder whose files no other process is
    writing (a run folder and its Trainer): there every such file is a dead write. Returns the paths removed."""
    folder = pathlib.Path(folder)
    removed = []
    for name in names:
        stale = folder.glob(glob.escape(f".{name}.") + "*.tmp")
        for path in [*stale, _link_name(folder / name)]:
            try:
                if path.is_file() and not path.is_symlink():
                    path.unlink()
                    removed.append(path)
            except OSError:
                pass
    return removed


def _publish_copy(src: pathlib.Path, dst: pathlib.Path, state) -> None:
    tmp = _link_name(dst)
    try:
        if tmp.exists():
            tmp.unlink()
        os.link(src, tmp)
        os.replace(tmp, dst)
    except OSError:  # no hard links here: write it again
        tmp.unlink(missing_ok=True)
        save_checkpoint(dst, state)


class AlgorithmCacheFile:
    """The conv algorithm choices beside the checkpoints: save() writes them when they differ from what it wrote
    last (after the first epochs they rarely change, and each write is an fsync); a failure only warns (the
    checkpoint still counts)."""

    def __init__(self, path):
        self.path = pathlib.Path(path)
        self._written = None

    def save(self) -> None:
        try:
            entries = sorted(conv.algorithm_cache_entries(), key=lambda e: e["key"])
            if entries == self._written and self.path.is_file():
                return
            conv.save_algorithm_cache(self.path)
            self._written = entries
        except Exception as e:  # the cache is an optimisation: never stop training for it
            warnings.warn(f"could not write the convolution algorithm cache {self.path}: {e}", RuntimeWarning,
                          stacklevel=2)


def load_algorithm_cache(path: pathlib.Path) -> None:
    """Reuse a run's conv algorithm choices (before the first forward); a missing or unreadable file only warns,
    and the algorithms are then timed again."""
    if not path.is_file():
        warnings.warn(f"--resume: no convolution algorithm cache {path}; algorithms are timed again, so the "
                      "resumed run may round differently", RuntimeWarning, stacklevel=2)
        return
    try:
        conv.load_algorithm_cache(path)
    except Exception as e:
        warnings.warn(f"--resume: could not load the convolution algorithm cache {path}: {e}", RuntimeWarning,
                      stacklevel=2)
