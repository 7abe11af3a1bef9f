"""The GPU libraries' files read into the page cache ahead of their first use.

cuDNN loads its sub-libraries (the precompiled engines alone are hundreds of MB) and cuBLAS and NVRTC when the
first convolution or kernel compile needs them, and the loader then faults their pages in as they are touched:
small scattered reads. On a machine whose page cache has never held them, a fresh process pays for those reads
inside its first training step. readahead() reads the files whole, sequentially, on a background thread (the reads
release the GIL), while the process does its other start-up work, in the order a training step first needs them.
(posix_fadvise's WILLNEED would spare the copy to user space, but Linux caps each call at the read-ahead window.)
Once the files are cached, this costs the thread a memory copy of them.
"""

from __future__ import annotations

import glob
import os
import threading

# The wheels' libraries a training step loads, in the order it first needs them: NVRTC (cupy's kernel compiles),
# cuDNN's graph, ops, convolution, heuristic and engine libraries, cuBLAS; then the rest of cuDNN.
_ORDER = ("libnvrtc", "libcudnn_graph", "libcudnn_ops", "libcudnn_cnn", "libcudnn_heuristic",
          "libcudnn_engines_precompiled", "libcublasLt", "libcublas.", "libcudnn")
_CHUNK = 8 << 20


def library_files() -> list[str]:
    """The shared libraries of the nvidia-* wheels that a first training step loads, in the order it needs them
    (none without the wheels)."""
    try:
        import nvidia
    except ImportError:
        return []
    files = [path for root in nvidia.__path__ for path in glob.glob(os.path.join(root, "*", "lib", "lib*.so*"))
             if os.path.isfile(path)]

    def rank(path):
        name = os.path.basename(path)
        return next((i for i, prefix in enumerate(_ORDER) if name.startswith(prefix)), None), name

    return sorted((p for p in files if rank(p)[0] is not None), key=rank)


def _read(paths) -> None:
    buffer = bytearray(_CHUNK)
    for path in paths:
        try:
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buffer):
                    pass
        except OSError:  # unreadable: its first use reports what matters
            continue


def readahead(paths=None) -> threading.Thread:
    """Start reading `paths` (default: library_files()) into the page cache on a daemon thread, and return it.
    Never raises for a file it cannot read."""
    paths = library_files() if paths is None else list(paths)
    thread = threading.Thread(target=_read, args=(paths,), name="library-readahead", daemon=True)
    thread.start()
    return thread


def evict(paths=None) -> None:
    """Drop `paths`' pages from the page cache where no process maps them (posix_fadvise DONTNEED): a fresh
    machine's cold start, simulated, for measuring readahead()."""
    if not hasattr(os, "posix_fadvise"):
        return
    for path in library_files() if paths is None else paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            pass
        finally:
            os.close(fd)
