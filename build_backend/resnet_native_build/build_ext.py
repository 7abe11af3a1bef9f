"""The build_ext command of resnet_native._C: C++ sources with the host compiler, .cu sources with nvcc (or clang
for a CUDA 12 build from wheels), all in parallel, linked against the static CUDA runtime and libcudnn.so.9.

Environment:
  RESNET_NATIVE_CUDA          12 or 13: the CUDA flavour (default: the local toolkit's major, else 13)
  CUDA_HOME / CUDA_PATH       a CUDA toolkit (default: the nvcc on PATH, /usr/local/cuda, or the CUDA wheels)
  CUDNN_HOME                  cuDNN with include/ and lib/ (default: a system cuDNN 9, else the nvidia-cudnn wheel)
  RESNET_NATIVE_CUDA_ARCHS    e.g. "90" or "80;90" (default "80;90"; PTX of the newest is embedded too)
  RESNET_NATIVE_BUILD_JOBS    parallel compile jobs (default: all cores)
  RESNET_NATIVE_DEBUG_INFO    1: keep host debug info (default: none, and the linker strips what libraries bring)
  RESNET_NATIVE_CLANG         the clang++ for a CUDA 12 build from wheels (default: the newest clang++-NN >= 19)
  RESNET_NATIVE_CUTLASS       auto|0|1: the own convolution kernels (csrc/ownconv/sm90/, CUTLASS), see cutlass.py
  CUTLASS_DIR                 a CUTLASS tree for them (default: the nvidia-cutlass wheel)
"""

import glob
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from pybind11.setup_helpers import Pybind11Extension
from setuptools.command.build_ext import build_ext

from . import cutlass, toolchain

cuda_archs = toolchain.cuda_archs  # the option is parsed where the build backend can read it too (cutlass.py)

DEBUG_ENV = "RESNET_NATIVE_DEBUG_INFO"
JOBS_ENV = "RESNET_NATIVE_BUILD_JOBS"


def debug_info():
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def extension():
    """The extension with its sources; where CUDA and cuDNN come from is settled when it is built."""
    sources = sorted(glob.glob("csrc/**/*.cpp", recursive=True) + glob.glob("csrc/**/*.cu", recursive=True))
    sources = [s for s in sources if not cutlass.is_source(s)]  # added by BuildExt when the build compiles them
    return Pybind11Extension("resnet_native._C", sources=sources, include_dirs=["csrc"], cxx_std=17)


def _c_string(text):
    """A -D value that the preprocessor reads as a C string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _clang_cuda_root(tc, build_temp):
    """A directory laid out as a CUDA installation for clang's --cuda-path, made of the CUDA 12 wheels: headers,
    libdevice, ptxas, and fatbinary.py standing in for the fatbinary tool the wheels lack."""
    root = os.path.join(os.path.abspath(build_temp), "clang-cuda-root")
    include = os.path.join(root, "include")
    os.makedirs(include, exist_ok=True)
    os.makedirs(os.path.join(root, "bin"), exist_ok=True)
    os.makedirs(os.path.join(root, "nvvm"), exist_ok=True)
    nvcc, runtime, cccl = (tc.clang_parts[k] for k in ("cuda_nvcc", "cuda_runtime", "cuda_cccl"))
    links = {os.path.join(root, "bin", "ptxas"): os.path.join(nvcc, "bin", "ptxas"),
             os.path.join(root, "nvvm", "libdevice"): os.path.join(nvcc, "nvvm", "libdevice")}
    for directory in (os.path.join(runtime, "include"), os.path.join(nvcc, "include"), os.path.join(cccl, "include")):
        for name in os.listdir(directory):
            links.setdefault(os.path.join(include, name), os.path.join(directory, name))
    for link, target in links.items():
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(target, link)
    # clang's CUDA wrapper includes this cuRAND header, which only a full toolkit has; nothing here uses it.
    with open(os.path.join(include, "curand_mtgp32_kernel.h"), "w") as f:
        f.write("// cuRAND is not used by resnet_native; clang's CUDA wrapper includes this header.\n")
    fatbin_lib = os.path.join(tc.clang_parts["nvfatbin"], "lib", "libnvfatbin.so.12")
    shim = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fatbinary.py")
    with open(os.path.join(root, "bin", "fatbinary"), "w") as f:
        f.write(f'#!/bin/sh\nexec "{sys.executable}" "{shim}" "{fatbin_lib}" "$@"\n')
    os.chmod(os.path.join(root, "bin", "fatbinary"), 0o755)
    return root


def device_flags(tc, archs, cuda_root):
    """Compiler flags for .cu sources: SASS for every arch, PTX for the newest."""
    if tc.compiler == "nvcc":
        flags = ["-O3", "-std=c++17", "--expt-relaxed-constexpr", "-Xcompiler", "-fPIC,-fvisibility=hidden",
                 "-lineinfo"]
        flags += [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
        flags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
        return flags + (["-g"] if debug_info() else [])
    flags = ["-x", "cuda", f"--cuda-path={cuda_root}", "-Wno-unknown-cuda-version", "-O3", "-std=c++17", "-fPIC",
             "-fvisibility=hidden", "--no-cuda-include-ptx=all", f"--cuda-include-ptx=sm_{archs[-1]}"]
    flags += [f"--cuda-gpu-arch=sm_{a}" for a in archs]
    return flags + (["-g"] if debug_info() else ["-g0"])


class BuildExt(build_ext):
    """Finds the toolchain, then compiles every source of the extension in parallel; .cu files go to the device
    compiler."""

    def build_extensions(self):
        major = toolchain.default_major()
        tc = toolchain.cuda_toolchain(major)
        cudnn = toolchain.find_cudnn(major)
        archs = cuda_archs()
        cuda_root = _clang_cuda_root(tc, self.build_temp) if tc.compiler == "clang" else None
        description = toolchain.compiler_description(tc)
        own = cutlass.plan(tc, archs)
        print(f"resnet_native: CUDA {major} with {description} ({tc.source}), sm_{' sm_'.join(archs)}, "
              f"cuDNN from {cudnn.source} ({cudnn.include_dir})")
        print("resnet_native: own convolution kernels: " + (
            f"{len(own.sources)} sm_90a translation units, CUTLASS {own.cutlass.version_text} from "
            f"{own.cutlass.source} ({own.cutlass.root})" if own.built else own.reason))
        build_macros = [("RN_BUILD_CUDA_MAJOR", str(major)), ("RN_BUILD_CUDA_COMPILER", _c_string(description)),
                        ("RN_BUILD_CUDA_ARCHS", _c_string(";".join(archs))),
                        ("RN_BUILD_CUDA_SOURCE", _c_string(tc.source)),
                        ("RN_BUILD_CUDNN_SOURCE", _c_string(cudnn.source)),
                        ("RN_BUILD_DEBUG_INFO", "1" if debug_info() else "0"),
                        ("RN_BUILD_OWN_CONV_BUILT", "1" if own.built else "0"),
                        ("RN_BUILD_OWN_CONV_REASON", _c_string(own.reason)),
                        ("RN_BUILD_OWN_CONV_CUTLASS", _c_string(own.cutlass.version_text if own.built else ""))]
        for ext in self.extensions:
            ext.sources = [*ext.sources, *own.sources]
            ext.include_dirs = [*ext.include_dirs, *tc.include_dirs, cudnn.include_dir]
            ext.define_macros = [*ext.define_macros, *build_macros]
            ext.library_dirs = [*ext.library_dirs, tc.lib_dir, cudnn.lib_dir]
            # The wheel ships only libcudnn.so.9 (no unversioned link), hence -l:. Static cudart: no CUDA runtime
            # wheel is needed at run time, only the driver. Installed, site-packages/resnet_native/_C.so finds the
            # cuDNN wheel at site-packages/nvidia/cudnn/lib (the loader preloads it in other layouts).
            ext.extra_link_args = [*ext.extra_link_args, "-l:libcudnn.so.9", "-lcudart_static", "-ldl", "-lrt",
                                   "-lpthread", "-Wl,-rpath,$ORIGIN/../nvidia/cudnn/lib"]
            if cudnn.source != "wheel":
                ext.extra_link_args.append(f"-Wl,-rpath,{cudnn.lib_dir}")  # a local build, found where it was built
            if not debug_info():
                ext.extra_link_args.append("-Wl,--strip-debug")  # what static libraries bring along
            cxx = [*ext.extra_compile_args, "-O3", "-g" if debug_info() else "-g0"]
            cuda = device_flags(tc, archs, cuda_root)
            ext.extra_compile_args = {"cxx": cxx, "cuda": cuda,
                                      "cutlass": cutlass.device_flags(own.cutlass, cuda) if own.built else []}
        self._compile_in_parallel(tc)
        super().build_extensions()

    def _compile_in_parallel(self, tc):
        compiler = self.compiler
        compiler.src_extensions.append(".cu")
        default_compile = compiler._compile

        def compile_one(obj, src, ext, cc_args, extra_postargs, pp_opts):
            if src.endswith(".cu"):
                # The build-info strings are for bind_core.cpp; nvcc re-quotes -D values with spaces unreliably.
                defines = [opt for opt in pp_opts if not opt.startswith("-DRN_BUILD_")]
                kernel = cutlass.is_source(src)
                flags = extra_postargs["cutlass" if kernel else "cuda"]
                start = time.monotonic()
                subprocess.check_call([tc.compiler_path, "-c", src, "-o", obj, *defines, *flags])
                if kernel:
                    print(f"resnet_native: {src}: {time.monotonic() - start:.0f} s", flush=True)
            else:
                default_compile(obj, src, ext, cc_args, extra_postargs["cxx"], pp_opts)

        def parallel_compile(sources, output_dir=None, macros=None, include_dirs=None, debug=0, extra_preargs=None,
                             extra_postargs=None, depends=None):
            macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
                output_dir, macros, include_dirs, sources, depends, extra_postargs)
            cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)
            jobs = int(os.environ.get(JOBS_ENV, os.cpu_count() or 1))

            def run(obj):
                src, ext = build[obj]
                compile_one(obj, src, ext, cc_args, extra_postargs, pp_opts)

            # The CUTLASS units take a minute each: started first, the small ones fill the other workers meanwhile.
            ordered = sorted(objects, key=lambda obj: not cutlass.is_source(build[obj][0]))
            with ThreadPoolExecutor(max_workers=jobs) as pool:
                list(pool.map(run, ordered))
            return objects

        compiler.compile = parallel_compile
