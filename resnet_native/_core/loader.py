"""Loads cuDNN from the nvidia-cudnn-cu1x wheel, then the compiled core, and checks they agree.

Why preload: the wheel's libcudnn.so.9 is not on the loader's search path, and an editable install cannot use
the extension's rpath. Loading it first with RTLD_GLOBAL lets the extension's dependency on libcudnn.so.9
resolve to this copy, whatever the install layout.

When the core cannot be loaded, the ImportError says why and what fixes it: a source tree without a built
extension (it shadows the installed package when Python runs from the checkout), or no cuDNN 9.
"""

import ctypes
import glob
import importlib.machinery
import importlib.metadata
import os

CUDNN_LIBRARY = None  # the path of the libcudnn.so.9 that was loaded (None: left to the system loader)

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # resnet_native/, where _C lies


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


def _installed_distribution():
    """The installed resnet_native distribution, or None."""
    try:
        return importlib.metadata.distribution("resnet_native")
    except importlib.metadata.PackageNotFoundError:
        return None


def _cudnn_install_command():
    """The pip command that installs the cuDNN this build was made for (from the installed metadata)."""
    dist = _installed_distribution()
    if dist is not None and os.path.realpath(str(dist.locate_file("resnet_native"))) == os.path.realpath(_PACKAGE_DIR):
        for req in dist.requires or []:
            if req.startswith("nvidia-cudnn-cu"):
                return f"pip install '{req.split(';')[0].strip()}'"
    return "pip install nvidia-cudnn-cu13 (a CUDA 13 build) or pip install nvidia-cudnn-cu12 (a CUDA 12 build)"


def _has_built_extension():
    return any(glob.glob(os.path.join(_PACKAGE_DIR, "_C" + suffix))
               for suffix in importlib.machinery.EXTENSION_SUFFIXES)


def _import_error(err):
    """An ImportError that says why resnet_native._C did not load and how to fix it."""
    tree = os.path.dirname(_PACKAGE_DIR)
    if not _has_built_extension():
        if os.path.exists(os.path.join(tree, "pyproject.toml")):
            dist = _installed_distribution()
            installed = os.path.realpath(str(dist.locate_file("resnet_native"))) if dist is not None else None
            elsewhere = ""
            if installed and installed != os.path.realpath(_PACKAGE_DIR) and os.path.isdir(installed):
                elsewhere = f" (resnet_native {dist.version} is installed at {installed})"
            return ImportError(
                f"resnet_native was imported from its source tree {tree}, which has no built extension "
                f"resnet_native/_C{importlib.machinery.EXTENSION_SUFFIXES[0]}: when Python runs from the checkout, "
                f"the current directory comes first on sys.path and the source tree shadows the installed "
                f"package{elsewhere}. Run from another directory to use the installed package, or build in place "
                f"with `pip install -e .`."
            )
        return ImportError(f"resnet_native's compiled core _C is missing from {_PACKAGE_DIR}: reinstall resnet_native")
    if "libcudnn" in str(err):
        return ImportError(f"resnet_native needs cuDNN 9, which was not found ({err}): {_cudnn_install_command()}, "
                           "or set CUDNN_HOME to a cuDNN 9 with lib/libcudnn.so.9")
    return ImportError(f"resnet_native's compiled core _C failed to load: {err}")


_preload_cudnn()

try:
    from .. import _C
except ImportError as err:
    raise _import_error(err) from err

_runtime_major = _C.cudnn_version() // 10000
if _runtime_major != _C.CUDNN_MAJOR_COMPILED:
    raise ImportError(
        f"resnet_native was compiled against cuDNN {_C.CUDNN_MAJOR_COMPILED}.x but loaded cuDNN "
        f"{_C.cudnn_version()} from {CUDNN_LIBRARY or 'the system library path'}: {_cudnn_install_command()} "
        f"({_C.CUDNN_MAJOR_COMPILED}.x) or set CUDNN_HOME"
    )


def build_info() -> dict:
    """How the native core was built and what it runs with: the CUDA flavour (12 or 13), the device compiler and
    where the toolkit came from, the statically linked CUDA runtime's version, the architectures built (SASS for
    each; PTX for the last), the cuDNN headers built against and the cuDNN library loaded, the CUDA version the
    driver supports (0: no driver), the cupy packages installed (more than one breaks cupy), and whether the own
    convolution kernels were built: own_conv_kernels = {built, reason ('not built: why' when not), cutlass (the
    headers' version), kernels (their names)}."""
    info = dict(_C.build_info())
    info["cuda_archs"] = [a for a in info["cuda_archs"].split(";") if a]
    info["ptx_arch"] = info["cuda_archs"][-1] if info["cuda_archs"] else None
    info["cudnn_loaded_version"] = _C.cudnn_version()
    info["cudnn_library"] = CUDNN_LIBRARY
    info["cupy"] = sorted(f"{d.metadata['Name']} {d.version}" for d in importlib.metadata.distributions()
                          if (d.metadata["Name"] or "").lower().startswith("cupy"))
    return info
