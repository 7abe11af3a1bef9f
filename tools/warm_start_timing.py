"""Where a fresh machine's warm start goes: the priming's phases, alone and beside a decode of the CIFAR-10 source.

    CUPY_CACHE_DIR=$(mktemp -d) python tools/warm_start_timing.py --data .data/cifar10-jpeg.tar.xz \
        --decode {none,nice,plain} [--recipe B] [--nice 10] [--context-first] [--cold-libraries]

Runs training/warm_start.prime_first_steps (the recipe's throwaway model, one eager training step per training
batch shape, one forward per evaluation batch shape), which times its own phases with the device synchronised.
With --decode nice|plain a forked child decodes the source meanwhile (decode_source, every core; 'nice' lowers
its priority by --nice) and its own wall time is printed too. --context-first creates the CUDA context before the
fork, as the trainer does (its GPU check comes first). Run each mode in a fresh process with an empty
CUPY_CACHE_DIR: cupy's kernel compiles are part of what a fresh machine pays. --cold-libraries first drops the
cuDNN / cuBLAS / NVRTC files of the nvidia wheels from the page cache (posix_fadvise DONTNEED: a fresh machine's
cold start). The share of those files in the page cache is printed at the start and after the priming. One JSON
line on stdout.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time


def decode(path, niceness, queue):
    from resnet_native.data.cifar10 import decode_source

    if niceness:
        os.nice(niceness)
    t0 = time.perf_counter()
    decode_source(path)
    queue.put(time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True)
    p.add_argument("--decode", choices=["none", "nice", "plain"], default="none")
    p.add_argument("--recipe", default="B")
    p.add_argument("--nice", type=int, default=10)
    p.add_argument("--context-first", action="store_true", help="the CUDA context before the fork")
    p.add_argument("--cold-libraries", action="store_true", help="evict the GPU libraries from the page cache first")
    args = p.parse_args()
    libraries = library_files()
    if args.cold_libraries:
        for path in libraries:
            fd = os.open(path, os.O_RDONLY)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
    cached_at_start = resident_share(libraries)

    t_import = time.perf_counter()
    from resnet_native.training.config import TrainConfig, load_recipe
    from resnet_native.training.warm_start import prime_first_steps

    cfg = TrainConfig.from_dict(load_recipe(args.recipe))
    out = {"decode": args.decode, "imports_s": time.perf_counter() - t_import, "libraries_cached": cached_at_start}
    if args.context_first:
        import resnet_native as rn

        t_context = time.perf_counter()
        rn.require_gpu()
        out["context_first_s"] = time.perf_counter() - t_context
    queue = multiprocessing.get_context("fork").SimpleQueue()
    child = None
    if args.decode != "none":
        niceness = args.nice if args.decode == "nice" else 0
        child = multiprocessing.get_context("fork").Process(target=decode, args=(args.data, niceness, queue))
        child.start()
    t_prime = time.perf_counter()
    out.update({f"{phase}_s": s for phase, s in prime_first_steps(cfg).items()})
    out["priming_s"] = time.perf_counter() - t_prime
    if child is not None:
        out["decode_s"] = queue.get()
        child.join()
        out["both_s"] = time.perf_counter() - t_prime
    out["libraries_cached_after"] = resident_share(libraries)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in out.items()}))


def library_files() -> list:
    """The nvidia wheels' cuDNN, cuBLAS and NVRTC libraries."""
    import glob

    import nvidia

    return [path for root in nvidia.__path__ for path in glob.glob(os.path.join(root, "*", "lib", "lib*.so*"))
            if os.path.basename(path).startswith(("libcudnn", "libcublas", "libnvrtc"))]


def resident_share(paths) -> float:
    """The share of the files' pages in the page cache (mincore over a read-only mapping of each)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    resident = total = 0
    for path in paths:
        size = os.path.getsize(path)
        if not size:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            pages = -(-size // mmap.PAGESIZE)
            vec = ctypes.create_string_buffer(pages)
            if addr not in (None, ctypes.c_void_p(-1).value) and libc.mincore(addr, size, vec) == 0:
                resident += sum(b & 1 for b in vec.raw)
                total += pages
            if addr not in (None, ctypes.c_void_p(-1).value):
                libc.munmap(addr, size)
        finally:
            os.close(fd)
    return resident / total if total else float("nan")


if __name__ == "__main__":
    main()
