"""Finds what compiling resnet_native._C needs for a CUDA flavour: a device compiler, the CUDA headers, the static
CUDA runtime, and cuDNN's headers and library.

Where each comes from, first found wins:
- CUDA: a local toolkit of the flavour's major (CUDA_HOME, CUDA_PATH, the nvcc on PATH, /usr/local/cuda,
  /usr/local/cuda-<major>*); else the flavour's toolkit wheels installed in this interpreter (CUDA 13: nvcc under
  nvidia/cu13; CUDA 12: clang >= 19 with the nvidia-cuda-*-cu12 wheels, as no CUDA 12 nvcc is on PyPI).
- cuDNN: CUDNN_HOME; the nvidia-cudnn-cu12/-cu13 wheel installed in this interpreter; a system cuDNN 9 (the
  toolkit's include/ or /usr/include, with libcudnn.so.9 beside it).

Only headers are read to find versions, so the build backend can ask before anything is installed.
"""

import glob
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from . import flavours

CLANG_ENV = "RESNET_NATIVE_CLANG"
MIN_CLANG = 19  # the oldest clang this build was tried with on CUDA 12.9's headers
ARCHS_ENV = "RESNET_NATIVE_CUDA_ARCHS"
DEFAULT_ARCHS = "80;90"


def cuda_archs():
    """The compute capabilities to build SASS for, e.g. ['80', '90'] (the last also gets PTX)."""
    text = os.environ.get(ARCHS_ENV, DEFAULT_ARCHS)
    archs = [a.strip() for a in text.replace(",", ";").split(";") if a.strip()]
    if not archs or not all(re.fullmatch(r"\d{2,3}[af]?", a) for a in archs):
        raise SystemExit(f"resnet_native: {ARCHS_ENV}={text!r}: expected compute capabilities such as '80;90'")
    return archs


def _header_define(path, name):
    """The integer value of `#define NAME value` in a header, or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            match = re.search(rf"#define\s+{name}\s+(\d+)", f.read())
    except OSError:
        return None
    return int(match.group(1)) if match else None


def cuda_header_major(include_dir):
    """The CUDA major version of the headers in include_dir (from cuda.h's CUDA_VERSION), or None."""
    version = _header_define(os.path.join(include_dir, "cuda.h"), "CUDA_VERSION")
    return version // 1000 if version else None


def _local_toolkits():
    """Local CUDA toolkit roots, most explicit first (CUDA_HOME, CUDA_PATH, nvcc on PATH, /usr/local/cuda*)."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    roots += ["/usr/local/cuda", *sorted(glob.glob("/usr/local/cuda-*"), reverse=True)]
    found, seen = [], set()
    for root in roots:
        is_toolkit = root and os.path.isfile(os.path.join(root, "bin", "nvcc")) and cuda_header_major(
            os.path.join(root, "include"))
        if is_toolkit and os.path.realpath(root) not in seen:
            found.append(root)
            seen.add(os.path.realpath(root))
    return found


def local_toolkit(major=None):
    """The first local toolkit (of `major`, when given), or None."""
    for root in _local_toolkits():
        if major is None or cuda_header_major(os.path.join(root, "include")) == major:
            return root
    return None


def default_major():
    """RESNET_NATIVE_CUDA, else the first local toolkit's major, else the flavour built from wheels."""
    requested = flavours.requested_major()
    if requested is not None:
        return requested
    root = local_toolkit()
    major = cuda_header_major(os.path.join(root, "include")) if root else None
    return major if major in flavours.FLAVOURS else flavours.WHEEL_FLAVOUR


def _package_dir(module):
    """The directory of an installed namespace or regular package (e.g. nvidia.cuda_nvcc), or None."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def find_clang():
    """(path, major) of a clang++ that can compile CUDA 12 code, or None. RESNET_NATIVE_CLANG names one."""
    names = [os.environ[CLANG_ENV]] if os.environ.get(CLANG_ENV) else [
        *(f"clang++-{v}" for v in range(22, MIN_CLANG - 1, -1)), "clang++"]
    for name in names:
        path = shutil.which(name)
        if not path:
            continue
        try:
            text = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            continue
        match = re.search(r"clang version (\d+)\.", text)
        if match and int(match.group(1)) >= MIN_CLANG:
            return path, int(match.group(1))
    return None


@dataclass
class CudaToolchain:
    major: int
    compiler: str  # "nvcc" or "clang"
    compiler_path: str
    include_dirs: list
    lib_dir: str  # holds libcudart_static.a
    source: str  # "toolkit <root>" or "wheels"
    # clang only: the wheels' directories that make up a CUDA installation for --cuda-path.
    clang_parts: dict = field(default_factory=dict)


def _nvcc_toolchain(root, major, source):
    lib = next((os.path.join(root, d) for d in ("lib64", "lib") if os.path.isdir(os.path.join(root, d))), root)
    return CudaToolchain(major, "nvcc", os.path.join(root, "bin", "nvcc"), [os.path.join(root, "include")], lib,
                         source)


def missing_toolchain_message(major):
    flavour = flavours.FLAVOURS[major]
    wheels = " ".join(f"'{w}'" for w in flavour.toolkit_wheels)
    if major == 12:
        how = (f"a CUDA 12 toolkit (set CUDA_HOME), or clang >= {MIN_CLANG} (e.g. apt-get install clang-19; "
               f"{CLANG_ENV} names another) with the wheels {wheels}")
    else:
        how = f"a CUDA 13 toolkit (set CUDA_HOME), or the wheels {wheels}"
    return f"resnet_native: building for CUDA {major} ({flavours.FLAVOUR_ENV}={major}) needs {how}"


def cuda_toolchain(major):
    """The CudaToolchain for flavour `major`; SystemExit naming what to install when there is none."""
    root = local_toolkit(major)
    if root:
        return _nvcc_toolchain(root, major, f"toolkit {root}")
    if major == 13:
        wheel_root = _package_dir("nvidia.cu13")
        if wheel_root and os.path.isfile(os.path.join(wheel_root, "bin", "nvcc")):
            return _nvcc_toolchain(wheel_root, 13, "wheels")
        raise SystemExit(missing_toolchain_message(13))
    parts = {name: _package_dir(f"nvidia.{name}") for name in ("cuda_nvcc", "cuda_runtime", "cuda_cccl", "nvfatbin")}
    clang = find_clang()
    if clang is None or not all(parts.values()):
        raise SystemExit(missing_toolchain_message(12))
    includes = [os.path.join(parts[name], "include") for name in ("cuda_runtime", "cuda_nvcc", "cuda_cccl")]
    return CudaToolchain(12, "clang", clang[0], includes, os.path.join(parts["cuda_runtime"], "lib"), "wheels",
                         parts)


def toolkit_needs_wheels(major):
    """True when flavour `major` has no local toolkit, so the build environment needs the toolkit wheels."""
    return local_toolkit(major) is None


@dataclass
class Cudnn:
    include_dir: str
    lib_dir: str
    source: str  # "CUDNN_HOME", "system" or "wheel"


def _cudnn_in(include_dir, lib_dirs):
    """A Cudnn when include_dir holds cuDNN 9's headers and one of lib_dirs libcudnn.so.9, else None."""
    if _header_define(os.path.join(include_dir, "cudnn_version.h"), "CUDNN_MAJOR") != 9:
        return None
    for lib in lib_dirs:
        if os.path.exists(os.path.join(lib, "libcudnn.so.9")):
            return include_dir, lib
    return None


def _cudnn_home():
    home = os.environ.get("CUDNN_HOME")
    if not home:
        return None
    found = _cudnn_in(os.path.join(home, "include"), [os.path.join(home, "lib"), os.path.join(home, "lib64")])
    if not found:
        raise SystemExit(f"resnet_native: CUDNN_HOME={home} holds no cuDNN 9 (include/cudnn_version.h and "
                         "lib/libcudnn.so.9)")
    return Cudnn(*found, "CUDNN_HOME")


def _wheel_cudnn():
    wheel = _package_dir("nvidia.cudnn")
    if wheel and os.path.isdir(os.path.join(wheel, "include")):
        return Cudnn(os.path.join(wheel, "include"), os.path.join(wheel, "lib"), "wheel")
    return None


def _system_cudnn(major):
    root = local_toolkit(major)
    candidates = [(os.path.join(root, "include"), [os.path.join(root, "lib64"), os.path.join(root, "lib")])] if root \
        else []
    candidates.append(("/usr/include", ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"]))
    for include_dir, lib_dirs in candidates:
        found = _cudnn_in(include_dir, lib_dirs)
        if found:
            return Cudnn(*found, "system")
    return None


def locate_cudnn(major):
    """The Cudnn to build against: CUDNN_HOME, else the wheel in this interpreter, else the system's; or None."""
    return _cudnn_home() or _wheel_cudnn() or _system_cudnn(major)


def cudnn_needs_wheel(major):
    """True when the build environment must get cuDNN from its wheel (no CUDNN_HOME, no system cuDNN 9)."""
    return _cudnn_home() is None and _system_cudnn(major) is None


def find_cudnn(major):
    """The Cudnn to build against; SystemExit naming the wheel to install when there is none."""
    found = locate_cudnn(major)
    if found is None:
        raise SystemExit(f"resnet_native: cuDNN 9 not found; pip install '{flavours.FLAVOURS[major].cudnn}' or "
                         "set CUDNN_HOME")
    return found


def tool_version(path, pattern):
    """The first match of `pattern` in `path --version`, or 'unknown'."""
    try:
        text = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    match = re.search(pattern, text)
    return match.group(1) if match else "unknown"


def compiler_description(tc):
    """e.g. 'nvcc 13.0.88' or 'clang 19.1.7, ptxas 12.9.86': what compiled the device code."""
    if tc.compiler == "nvcc":
        return "nvcc " + tool_version(tc.compiler_path, r"V(\d+\.\d+\.\d+)")
    ptxas = os.path.join(tc.clang_parts["cuda_nvcc"], "bin", "ptxas")
    clang = tool_version(tc.compiler_path, r"clang version (\d+\.\d+\.\d+)")
    version = tool_version(ptxas, r"V(\d+\.\d+\.\d+)")
    return f"clang {clang}, ptxas {version}"
