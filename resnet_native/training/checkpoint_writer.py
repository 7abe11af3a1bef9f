"""Checkpoints written in the background while the GPU keeps training, and the convolution algorithm cache saved
beside them (another algorithm gives other rounding, so the cache is part of what makes --resume exact)."""

from __future__ import annotations

import os
import pathlib
import queue
import sys
import threading
import warnings

from ..checkpoint import save_checkpoint


class CheckpointWriter:
    """Serialises and fsyncs checkpoints on a background thread.

    submit() takes host copies (state_dicts are NumPy) and returns at once; a later submit waits for the one before,
    and flush() for all of them. 'best' is published with a hard link to the file just written, when possible, so
    an improving epoch costs one write, not two. As a context manager it closes on exit; when the block raised,
    that error is the one reported and a pending write error is only printed.
    """

    def __init__(self):
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
                path, state, best_path = job
                save_checkpoint(path, state)
                if best_path is not None:
                    _publish_copy(path, best_path, state)
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


def _publish_copy(src: pathlib.Path, dst: pathlib.Path, state) -> None:
    tmp = dst.with_name(f".{dst.name}.link")
    try:
        if tmp.exists():
            tmp.unlink()
        os.link(src, tmp)
        os.replace(tmp, dst)
    except OSError:  # no hard links here: write it again
        tmp.unlink(missing_ok=True)
        save_checkpoint(dst, state)


def save_algorithm_cache(path: pathlib.Path) -> None:
    """Write the conv algorithm choices beside a checkpoint; a failure only warns (the checkpoint still counts)."""
    from .. import conv

    try:
        conv.save_algorithm_cache(path)
    except Exception as e:  # the cache is an optimisation: never stop training for it
        warnings.warn(f"could not write the convolution algorithm cache {path}: {e}", RuntimeWarning, stacklevel=2)


def load_algorithm_cache(path: pathlib.Path) -> None:
    """Reuse a run's conv algorithm choices (before the first forward); a missing or unreadable file only warns,
    and the algorithms are then timed again."""
    from .. import conv

    if not path.is_file():
        warnings.warn(f"--resume: no convolution algorithm cache {path}; algorithms are timed again, so the "
                      "resumed run may round differently", RuntimeWarning, stacklevel=2)
        return
    try:
        conv.load_algorithm_cache(path)
    except Exception as e:
        warnings.warn(f"--resume: could not load the convolution algorithm cache {path}: {e}", RuntimeWarning,
                      stacklevel=2)
