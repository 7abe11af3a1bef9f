"""resnet_native's build backend: setuptools.build_meta, with build requirements that follow the CUDA flavour.

Only what is missing is asked for: the CUDA toolkit wheels when no local toolkit of the flavour exists, the cuDNN
wheel (with the cuBLAS and NVRTC wheels it depends on) when neither CUDNN_HOME nor a system cuDNN 9 is there, and
the nvidia-cutlass wheel (headers of the own convolution kernels) when the build would compile them and no
CUTLASS_DIR is set (cutlass.py).
With `pip install --no-build-isolation` pip installs nothing, and the build uses what the interpreter has.
The build itself is setup.py with this package's build_ext (build_ext.py).
"""

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401  (the PEP 517 / PEP 660 hooks this backend does not change)
    build_editable,
    build_sdist,
    build_wheel,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

from . import cutlass, flavours, toolchain


def extension_build_requirements():
    """What compiling the extension needs beyond build-system.requires, for the flavour this environment builds."""
    major = toolchain.default_major()
    flavour = flavours.FLAVOURS[major]
    reqs = []
    if toolchain.toolkit_needs_wheels(major):
        if major == 12 and toolchain.find_clang() is None:
            raise SystemExit(toolchain.missing_toolchain_message(12))
        reqs += flavour.toolkit_wheels
    if toolchain.cudnn_needs_wheel(major):
        reqs.append(flavour.cudnn)
    if cutlass.needs_wheel(major):
        reqs.append(cutlass.REQUIREMENT)
    return reqs


def get_requires_for_build_wheel(config_settings=None):
    return _setuptools.get_requires_for_build_wheel(config_settings) + extension_build_requirements()


def get_requires_for_build_editable(config_settings=None):
    return _setuptools.get_requires_for_build_editable(config_settings) + extension_build_requirements()
