"""Captured CUDA graphs (resnet_native.cuda_graph, csrc/core/captured_graph.h) on a GPU: the memset nodes a capture
records become kernel nodes that write the same bytes (1-, 2- and 4-byte elements, 2-D, aligned or not), in the
same order with the work around them, replay after replay."""

import ctypes

import numpy as np
import pytest

from resnet_native._core import capture as cuda_graph
from resnet_native._core.loader import _C

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")


def driver():
    """libcuda's memsets of 2- and 4-byte elements and of 2-D regions (cupy has 1-D byte memsets only)."""
    lib = ctypes.CDLL("libcuda.so.1")
    u64, size, ptr = ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
    signatures = {"cuMemsetD16Async": [u64, ctypes.c_ushort, size, ptr],
                  "cuMemsetD32Async": [u64, ctypes.c_uint, size, ptr],
                  "cuMemsetD2D8Async": [u64, size, ctypes.c_ubyte, size, size, ptr]}
    for name, args in signatures.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = ctypes.c_int
    return lib


def capture(fn, stream, memsets_as_kernels):
    with stream:
        stream.begin_capture()
        try:
            fn()
        except BaseException:
            stream.end_capture()
            raise
        return _C._end_capture(stream.ptr, memsets_as_kernels)


# (offset, bytes of one element, value, elements per row, rows, pitch): what each memset of the test writes.
MEMSETS = [(0, 1, 0xAB, 4096, 1, 0),  # aligned: 16-byte stores
           (4099, 1, 0x5C, 1001, 1, 0),  # unaligned, odd length
           (6002, 2, 0xBEEF, 333, 1, 0),
           (8192, 4, 0x01234567, 1024, 1, 0),
           (16384, 1, 0x7F, 100, 40, 256)]  # 40 rows of 100 bytes, 256 bytes apart
POISON = 0x11


def expected_bytes(n):
    out = np.full(n, POISON, np.uint8)
    for offset, elem, value, width, rows, pitch in MEMSETS:
        row = np.frombuffer(np.full(width, value, f"<u{elem}").tobytes(), np.uint8)
        for r in range(rows):
            out[offset + r * pitch : offset + r * pitch + row.size] = row
    return out


@pytest.mark.parametrize("memsets_as_kernels", [True, False])
def test_memset_nodes_become_kernels_that_write_the_same_bytes(memsets_as_kernels):
    cuda = driver()
    stream = cp.cuda.Stream(non_blocking=True)
    n = 1 << 16
    with stream:  # zeroed on the stream the poison and the replays use: a non-blocking stream is not ordered
        buf = cp.zeros(n, dtype=cp.uint8)  # after the legacy default stream, whose late zeroing read as lost poison
        total = cp.zeros((), dtype=cp.uint64)

    def work():
        for offset, elem, value, width, rows, pitch in MEMSETS:
            dst = buf.data.ptr + offset
            if rows > 1:
                assert cuda.cuMemsetD2D8Async(dst, pitch, value, width, rows, stream.ptr) == 0
            elif elem == 1:
                cp.cuda.runtime.memsetAsync(dst, value, width, stream.ptr)
            else:
                assert getattr(cuda, f"cuMemsetD{8 * elem}Async")(dst, value, width, stream.ptr) == 0
        cp.sum(buf.view(cp.uint64), out=total)  # reads what the memsets wrote: their order with it is kept

    graph = capture(work, stream, memsets_as_kernels)
    assert graph.memset_kernels == (len(MEMSETS) if memsets_as_kernels else 0)
    graph.upload(stream)
    want = expected_bytes(n)
    for _ in range(2):  # each replay writes the same bytes over the poison again
        with stream:  # the poison, then the replay, in one stream's order
            buf.fill(POISON)
            total.fill(0)
        graph.launch(stream)
        stream.synchronize()
        got = cp.asnumpy(buf)
        assert np.array_equal(got, want), f"{np.count_nonzero(got != want)} bytes differ"
        assert int(total.get()) == int(want.view(np.uint64).sum(dtype=np.uint64))


def test_capture_graph_makes_memsets_kernels_and_launches_on_cupy_streams():
    stream = cp.cuda.Stream(non_blocking=True)
    pool = cp.cuda.MemoryPool()
    x = cp.ones(1000, dtype=cp.float32)

    def fn():
        cp.cuda.runtime.memsetAsync(x.data.ptr, 0, x.nbytes, stream.ptr)
        cp.add(x, 2, out=x)
        return x

    with stream:
        cp.add(x, 2, out=x)  # compiles cupy's kernel before the capture
    captured = cuda_graph.capture_graph(fn, stream, pool)
    assert captured.graph.memset_kernels == (1 if cuda_graph.MEMSETS_AS_KERNELS else 0)
    with stream:
        x.fill(7)
    cuda_graph.launch_ordered(captured.graph, stream)
    stream.synchronize()
    assert bool((x == 2).all())
