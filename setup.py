"""Builds resnet_native._C for one CUDA flavour; its run-time dependencies follow that flavour.

The build options (environment variables) and where CUDA and cuDNN come from are described in
build_backend/resnet_native_build/build_ext.py and toolchain.py; README.md has the short version.
"""

import os
import sys

from setuptools import setup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "build_backend"))

from resnet_native_build import build_ext, flavours, toolchain  # noqa: E402

major = toolchain.default_major()
cudnn = toolchain.locate_cudnn(major)
setup(
    ext_modules=[build_ext.extension()],
    cmdclass={"build_ext": build_ext.BuildExt},
    # An sdist, or a build that finds no cuDNN yet, declares the cuDNN wheel; only a build against CUDNN_HOME or
    # a system cuDNN leaves it out.
    install_requires=flavours.runtime_requirements(flavours.FLAVOURS[major], cudnn is None or cudnn.source == "wheel"),
)
