"""The two CUDA flavours resnet_native builds for, and the packages each one needs to build and to run.

A build is for one CUDA major version: the extension's device code, its statically linked CUDA runtime, the cupy
and the cuDNN wheel it runs with all belong to that version. `RESNET_NATIVE_CUDA=12|13` picks it; by default it
is the local CUDA toolkit's major, and 13 where there is none, because only CUDA 13's wheels carry a complete
nvcc (CUDA 12's nvidia-cuda-nvcc-cu12 holds ptxas and libnvvm, no nvcc).
"""

import os
from dataclasses import dataclass

FLAVOUR_ENV = "RESNET_NATIVE_CUDA"

# What every install needs at run time, whatever the flavour.
BASE_RUNTIME_REQUIREMENTS = ["numpy>=1.24", "pyyaml>=6", "tqdm>=4", "pillow>=9", "safetensors>=0.4"]


@dataclass(frozen=True)
class Flavour:
    major: int
    cupy: str  # the cupy wheel built for this CUDA major
    cudnn: str  # the cuDNN 9 wheel built for this CUDA major
    # Wheels that make up a toolkit where no local one exists: compiler, CUDA headers, static cudart.
    toolkit_wheels: tuple
    min_driver: str  # the oldest driver branch that runs this flavour's code


FLAVOURS = {
    # CUDA 12 has no nvcc on PyPI: without a local CUDA 12 toolkit, clang compiles the device code with these
    # wheels' headers, libdevice and ptxas, and nvFatbin packs the result (fatbinary.py).
    12: Flavour(
        major=12,
        cupy="cupy-cuda12x>=13",
        cudnn="nvidia-cudnn-cu12>=9.0,<10",
        toolkit_wheels=(
            "nvidia-cuda-nvcc-cu12>=12.4,<13",
            "nvidia-cuda-runtime-cu12>=12.4,<13",
            "nvidia-cuda-cccl-cu12>=12.4,<13",
            "nvidia-nvfatbin-cu12>=12.4,<13",
        ),
        min_driver="525.60",
    ),
    # CUDA 13's wheels install a complete toolkit under nvidia/cu13 (nvcc pulls in its crt, nvvm and runtime).
    13: Flavour(
        major=13,
        cupy="cupy-cuda13x>=13.6",
        cudnn="nvidia-cudnn-cu13>=9.19,<9.28",  # the cuDNN versions the GPU suite has passed on (docs/building.md)
        toolkit_wheels=("nvidia-cuda-nvcc>=13,<14", "nvidia-cuda-runtime>=13,<14", "nvidia-cuda-cccl>=13,<14"),
        min_driver="580",
    ),
}

WHEEL_FLAVOUR = 13  # the flavour built when no local CUDA toolkit exists


def requested_major():
    """The flavour named by RESNET_NATIVE_CUDA, or None when it is unset."""
    value = os.environ.get(FLAVOUR_ENV, "").strip()
    if not value:
        return None
    if value not in ("12", "13"):
        raise SystemExit(f"resnet_native: {FLAVOUR_ENV}={value!r}: expected 12 or 13")
    return int(value)


def runtime_requirements(flavour, cudnn_from_wheel):
    """Requires-Dist of a build: the base packages, the flavour's cupy, and its cuDNN wheel unless the build
    used a cuDNN of the system's (CUDNN_HOME or the toolkit's), which the loader then finds the same way."""
    reqs = [*BASE_RUNTIME_REQUIREMENTS, flavour.cupy]
    if cudnn_from_wheel:
        reqs.append(flavour.cudnn)
    return reqs
