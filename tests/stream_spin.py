"""A kernel that holds a stream for a given time (the GPU's global timer): GPU tests use it to put the device
behind the host and see that the host does not wait."""

import numpy as np

_SOURCE = r"""
extern "C" __global__ void spin_ns(long long duration) {
  long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < duration);
}
"""
_kernel = None


def spin_kernel():
    """cupy RawKernel spin_ns(duration_ns): launch as kernel((1,), (1,), (np.int64(ns),))."""
    global _kernel
    if _kernel is None:
        import cupy

        _kernel = cupy.RawKernel(_SOURCE, "spin_ns")
    return _kernel


def spin(ns: int) -> None:
    """Hold cupy's current stream for `ns` nanoseconds."""
    spin_kernel()((1,), (1,), (np.int64(ns),))
