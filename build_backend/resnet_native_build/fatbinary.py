"""A stand-in for CUDA's `fatbinary` tool, built on NVIDIA's nvFatbin library (the nvidia-nvfatbin-cu12 wheel).

clang compiles CUDA device code with the CUDA 12 `ptxas` from the nvidia-cuda-nvcc-cu12 wheel, then asks a
`fatbinary` program to pack the cubins and PTX into the fatbinary it embeds in the host object. The CUDA 12 wheels
ship no `fatbinary` (nor `nvcc`), so the build puts this script in its place. It accepts the command line clang
writes:

    fatbinary -64 --create OUT.fatbin --image=profile=sm_90,file=A.cubin --image=profile=compute_90,file=A.ptx

Usage: python fatbinary.py LIBNVFATBIN ARGS...   (LIBNVFATBIN: the path of libnvfatbin.so.12)
"""

import ctypes
import os
import sys
import tempfile


def parse(args):
    """(output path, [(kind, arch, file)], nvFatbin options) from clang's fatbinary command line."""
    out, images, options = None, [], []
    it = iter(args)
    for arg in it:
        if arg == "--create":
            out = next(it)
        elif arg.startswith("--create="):
            out = arg.split("=", 1)[1]
        elif arg.startswith("--image=") or arg.startswith("--image3="):
            fields = dict(part.split("=", 1) for part in arg.split("=", 1)[1].split(","))
            profile, path = fields["profile"], fields["file"]
            kind = "ptx" if profile.startswith("compute_") else "cubin"
            images.append((kind, profile.split("_", 1)[1], path))
        elif arg in ("-64", "-32", "-g"):
            options.append(arg)
        elif arg in ("--cuda", "-cuda"):
            options.append("-cuda")
        else:
            sys.exit(f"fatbinary (nvFatbin stand-in): unsupported argument {arg!r}")
    if out is None or not images:
        sys.exit("fatbinary (nvFatbin stand-in): expected --create OUT and at least one --image")
    return out, images, options


def main(argv):
    lib = ctypes.CDLL(argv[1])
    out, images, options = parse(argv[2:])
    lib.nvFatbinGetErrorString.restype = ctypes.c_char_p

    def check(result, what):
        if result != 0:
            sys.exit(f"fatbinary (nvFatbin stand-in): {what} failed: {lib.nvFatbinGetErrorString(result).decode()}")

    handle = ctypes.c_void_p()
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    check(lib.nvFatbinCreate(ctypes.byref(handle), opts, ctypes.c_size_t(len(options))), "nvFatbinCreate")
    try:
        for kind, arch, path in images:
            with open(path, "rb") as f:
                code = f.read()
            name = os.path.basename(path).encode()
            if kind == "ptx":
                code += b"\0"  # nvFatbinAddPTX takes a NUL-terminated string
                check(lib.nvFatbinAddPTX(handle, code, ctypes.c_size_t(len(code)), arch.encode(), name, b""),
                      f"adding PTX {path}")
            else:
                check(lib.nvFatbinAddCubin(handle, code, ctypes.c_size_t(len(code)), arch.encode(), name),
                      f"adding cubin {path}")
        size = ctypes.c_size_t()
        check(lib.nvFatbinSize(handle, ctypes.byref(size)), "nvFatbinSize")
        buffer = ctypes.create_string_buffer(size.value)
        check(lib.nvFatbinGet(handle, buffer), "nvFatbinGet")
    finally:
        lib.nvFatbinDestroy(ctypes.byref(handle))
    directory = os.path.dirname(os.path.abspath(out))
    with tempfile.NamedTemporaryFile(dir=directory, delete=False) as tmp:
        tmp.write(buffer.raw)
    os.replace(tmp.name, out)


if __name__ == "__main__":
    main(sys.argv)
