"""Builds resnet_native._C: C++ sources with the host compiler, .cu sources with nvcc, all in parallel.

Environment:
  CUDA_HOME / CUDA_PATH        CUDA toolkit (default: the directory above the nvcc on PATH)
  CUDNN_HOME                   cuDNN with include/ and lib/ (default: the nvidia-cudnn-cu1x wheel)
  RESNET_NATIVE_CUDA_ARCHS     e.g. "90" or "80;90" (default "80;90"; PTX of the newest is embedded too)
  RESNET_NATIVE_BUILD_JOBS     parallel compile jobs (default: all cores)
"""

import glob
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from pybind11.setup_helpers import Pybind11Extension
from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))


def cuda_home():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home:
        return home
    candidates = []
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates.append("/usr/local/cuda")  # nvcc on PATH may be a wrapper script outside the toolkit
    for home in candidates:
        if os.path.exists(os.path.join(home, "include", "cuda_runtime_api.h")):
            return home
    sys.exit("resnet_native: CUDA toolkit not found; put nvcc on PATH or set CUDA_HOME")


def cudnn_home():
    if os.environ.get("CUDNN_HOME"):
        return os.environ["CUDNN_HOME"]
    try:
        import nvidia.cudnn  # from build-system.requires, or installed (--no-build-isolation)
    except ImportError:
        sys.exit("resnet_native: cuDNN not found; pip install nvidia-cudnn-cu13 (or -cu12) or set CUDNN_HOME")
    return list(nvidia.cudnn.__path__)[0]


def cuda_archs():
    archs = [a for a in os.environ.get("RESNET_NATIVE_CUDA_ARCHS", "80;90").replace(",", ";").split(";") if a]
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    flags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")  # PTX for newer GPUs
    return flags


class BuildExt(build_ext):
    """Compiles every source of the extension in parallel; .cu files go to nvcc."""

    def build_extensions(self):
        compiler = self.compiler
        compiler.src_extensions.append(".cu")
        nvcc = os.path.join(cuda_home(), "bin", "nvcc")
        default_compile = compiler._compile

        def compile_one(obj, src, ext, cc_args, extra_postargs, pp_opts):
            if src.endswith(".cu"):
                postargs = extra_postargs["nvcc"] if isinstance(extra_postargs, dict) else []
                cmd = [nvcc, "-c", src, "-o", obj, *pp_opts, *postargs]
                subprocess.check_call(cmd)
            else:
                postargs = extra_postargs["cxx"] if isinstance(extra_postargs, dict) else extra_postargs
                default_compile(obj, src, ext, cc_args, postargs, pp_opts)

        def parallel_compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0,
                             extra_preargs=None, extra_postargs=None, depends=None):
            macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
                output_dir, macros, include_dirs, sources, depends, extra_postargs)
            cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
            jobs = int(os.environ.get("RESNET_NATIVE_BUILD_JOBS", os.cpu_count() or 1))

            def run(obj):
                src, ext = build[obj]
                compile_one(obj, src, ext, cc_args, extra_postargs, pp_opts)

            with ThreadPoolExecutor(max_workers=jobs) as pool:
                list(pool.map(run, objects))
            return objects

        compiler.compile = parallel_compile
        super().build_extensions()


def make_extension():
    cuda = cuda_home()
    cudnn = cudnn_home()
    sources = sorted(glob.glob("csrc/**/*.cpp", recursive=True) + glob.glob("csrc/**/*.cu", recursive=True))
    include_dirs = [os.path.join(cuda, "include"), os.path.join(cudnn, "include"), os.path.join(ROOT, "csrc")]
    cxx_flags = ["-O3", "-std=c++17", "-fvisibility=hidden"]
    nvcc_flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC,-fvisibility=hidden",
                  "-lineinfo", *cuda_archs()]
    cuda_lib = os.path.join(cuda, "lib64")
    if not os.path.isdir(cuda_lib):
        cuda_lib = os.path.join(cuda, "lib")
    cudnn_lib = os.path.join(cudnn, "lib")
    ext = Pybind11Extension(
        "resnet_native._C",
        sources=sources,
        include_dirs=include_dirs,
        cxx_std=17,
        library_dirs=[cuda_lib, cudnn_lib],
        # The wheel ships only libcudnn.so.9 (no unversioned link), hence -l:. Static cudart: no CUDA
        # runtime wheel is needed at run time, only the driver.
        extra_link_args=["-l:libcudnn.so.9", "-lcudart_static", "-ldl", "-lrt", "-lpthread",
                         # Installed: site-packages/resnet_native/_C.so -> site-packages/nvidia/cudnn/lib
                         "-Wl,-rpath,$ORIGIN/../nvidia/cudnn/lib"],
    )
    ext.extra_compile_args = {"cxx": cxx_flags, "nvcc": nvcc_flags}
    return ext


setup(ext_modules=[make_extension()], cmdclass={"build_ext": BuildExt})
