"""The own convolution kernels (csrc/ownconv/sm90/: CUTLASS's sm90 implicit GEMM): whether a build compiles them,
with which headers and flags. Only those translation units see CUTLASS; the rest of csrc never includes it.

They are compiled when all of these hold, else the extension says why (build_info()["own_conv_kernels"]):
- RESNET_NATIVE_CUTLASS is auto (the default) or 1; 0 leaves them out, and with 1 a build that cannot compile them
  fails instead;
- the device compiler is nvcc >= 12.0 (a CUDA 12 build from wheels compiles with clang: left out);
- "90" is among RESNET_NATIVE_CUDA_ARCHS: they are sm_90a code (wgmma, TMA), compiled for sm_90a alone, no PTX;
- CUTLASS 4.2's headers are found: CUTLASS_DIR (a CUTLASS tree with include/ and tools/util/include/), else the
  nvidia-cutlass wheel in this interpreter (headers under cutlass_library/source/; an isolated build asks for it,
  see extension_build_requirements). Headers only: nothing of CUTLASS is needed at run time.
"""

import glob
import os
import re
from dataclasses import dataclass, field

from . import toolchain

ENV = "RESNET_NATIVE_CUTLASS"
DIR_ENV = "CUTLASS_DIR"
SUPPORTED = (4, 2)  # the CUTLASS minor the kernels' template is written against
REQUIREMENT = "nvidia-cutlass>=4.2,<4.3"
SOURCE_DIR = "csrc/ownconv/sm90"
MIN_NVCC = (12, 0)


def mode():
    """'auto', '0' or '1' from RESNET_NATIVE_CUTLASS."""
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in ("auto", "0", "1"):
        raise SystemExit(f"resnet_native: {ENV}={value!r}: expected auto, 0 or 1")
    return value


def sources():
    """The kernels' translation units (one instantiation each)."""
    return sorted(glob.glob(os.path.join(SOURCE_DIR, "*.cu")))


def is_source(path):
    return os.path.normpath(os.path.dirname(path)).endswith(os.path.normpath(SOURCE_DIR))


def has_sm90(archs):
    return any(re.fullmatch(r"90[af]?", a) for a in archs)


@dataclass
class Cutlass:
    root: str  # holds include/ and tools/util/include/
    version: tuple  # (major, minor, patch)
    source: str  # "CUTLASS_DIR" or "wheel"

    @property
    def include_dirs(self):
        return [os.path.join(self.root, "include"), os.path.join(self.root, "tools", "util", "include")]

    @property
    def version_text(self):
        return ".".join(map(str, self.version))


def _version(root):
    header = os.path.join(root, "include", "cutlass", "version.h")
    parts = [toolchain._header_define(header, f"CUTLASS_{p}") for p in ("MAJOR", "MINOR", "PATCH")]
    has_tree = os.path.isfile(os.path.join(root, "include", "cutlass", "conv", "collective", "collective_builder.hpp"))
    utils = os.path.isfile(os.path.join(root, "tools", "util", "include", "cutlass", "util", "packed_stride.hpp"))
    return tuple(parts) if None not in parts and has_tree and utils else None


def find_cutlass():
    """CUTLASS_DIR, else the nvidia-cutlass wheel of this interpreter; None when neither. SystemExit for a
    CUTLASS_DIR without CUTLASS's headers (a mistake worth stopping for)."""
    root = os.environ.get(DIR_ENV)
    if root:
        version = _version(root)
        if version is None:
            raise SystemExit(f"resnet_native: {DIR_ENV}={root} holds no CUTLASS 3.x/4.x tree (include/cutlass/conv/"
                             "collective/ and tools/util/include/)")
        return Cutlass(root, version, DIR_ENV)
    wheel = toolchain._package_dir("cutlass_library")
    if wheel:
        root = os.path.join(wheel, "source")
        version = _version(root)
        if version is not None:
            return Cutlass(root, version, "wheel")
    return None


@dataclass
class Plan:
    built: bool
    reason: str  # "" when built
    cutlass: Cutlass = None
    sources: list = field(default_factory=list)


def _nvcc_version(tc):
    text = toolchain.tool_version(tc.compiler_path, r"V(\d+\.\d+)")
    return tuple(int(p) for p in text.split(".")) if text != "unknown" else None


def plan(tc, archs):
    """Whether this build compiles the kernels (see the module doc); SystemExit with RESNET_NATIVE_CUTLASS=1 when
    it cannot."""
    setting = mode()
    reason = ""
    cutlass = None
    if setting == "0":
        reason = f"{ENV}=0"
    elif tc.compiler != "nvcc":
        reason = "the device compiler is clang (a CUDA 12 build from wheels); they need nvcc >= 12.0"
    elif (_nvcc_version(tc) or (0, 0)) < MIN_NVCC:
        reason = f"they need nvcc >= 12.0, this is {toolchain.compiler_description(tc)}"
    elif not has_sm90(archs):
        reason = f"RESNET_NATIVE_CUDA_ARCHS={';'.join(archs)} has no 90 (they are sm_90a code)"
    else:
        cutlass = find_cutlass()
        if cutlass is None:
            reason = f"no CUTLASS headers (pip install '{REQUIREMENT}', or set {DIR_ENV})"
        elif cutlass.version[:2] != SUPPORTED:
            reason = (f"CUTLASS {cutlass.version_text} ({cutlass.source} {cutlass.root}); they are written for "
                      f"{'.'.join(map(str, SUPPORTED))}.x")
    if reason:
        if setting == "1":
            raise SystemExit(f"resnet_native: {ENV}=1 but the own convolution kernels cannot be built: {reason}")
        return Plan(False, "not built: " + reason)
    return Plan(True, "", cutlass, sources())


def device_flags(cutlass, base_flags):
    """nvcc flags of a kernel translation unit: the others' flags without their -gencode options, sm_90a SASS
    only (no PTX: nothing is compiled at run time), NDEBUG (CUTLASS's host asserts), CUTLASS's headers."""
    flags = [f for f in base_flags if not f.startswith("-gencode")]
    flags += ["-gencode=arch=compute_90a,code=sm_90a", "-DNDEBUG"]
    return flags + [f"-I{d}" for d in cutlass.include_dirs]


def needs_wheel(major):
    """Whether an isolated build environment of flavour `major` should get the nvidia-cutlass wheel: the kernels
    are wanted and could be built (nvcc, sm_90 among the archs) and CUTLASS_DIR does not point elsewhere."""
    if mode() == "0" or os.environ.get(DIR_ENV):
        return False
    clang = major == 12 and toolchain.toolkit_needs_wheels(12)
    return not clang and has_sm90(toolchain.cuda_archs())
