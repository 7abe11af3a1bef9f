"""Loads cuDNN from the nvidia-cudnn-cu1x wheel, then the compiled core, and checks they agree.

Why preload: the wheel's libcudnn.so.9 is not on the loader's search path, and an editable install cannot use
the extension's rpath. Loading it first with RTLD_GLOBAL lets the extension's dependency on libcudnn.so.9
resolve to this copy, whatever the install layout.
"""

import ctypes
import glob
import os

CUDNN_LIBRARY = None  # the path of the libcudnn.so.9 that was loaded (None: left to the system loader)


def _candidate_dirs():
    if os.environ.get("CUDNN_HOME"):
        yield os.path.join(os.environ["CUDNN_HOME"], "lib")
    try:
        import nvidia.cudnn
    except ImportError:
        return
    for root in nvidia.cudnn.__path__:
        yield os.path.join(root, "lib")


def _preload_cudnn():
    global CUDNN_LIBRARY
    for directory in _candidate_dirs():
        for path in sorted(glob.glob(os.path.join(directory, "libcudnn.so.*"))):
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            CUDNN_LIBRARY = path
            return


_preload_cudnn()

from . import _C  # noqa: E402

_runtime_major = _C.cudnn_version() // 10000
if _runtime_major != _C.CUDNN_MAJOR_COMPILED:
    raise ImportError(
        f"resnet_native was compiled against cuDNN {_C.CUDNN_MAJOR_COMPILED}.x but loaded cuDNN "
        f"{_C.cudnn_version()} from {CUDNN_LIBRARY or 'the system library path'}; install nvidia-cudnn-cu13 "
        f"(or -cu12) {_C.CUDNN_MAJOR_COMPILED}.x or set CUDNN_HOME"
    )
